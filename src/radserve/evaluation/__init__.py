"""Accuracy on held-out phantoms: metrics, lesion matching, summaries, the runner, and
the accuracy gate a reduced-precision variant must pass (:mod:`radserve.evaluation.gate`).

``radserve.evaluation.publish`` (JSON / Markdown / rich tables) and
``radserve.evaluation.pipeline_runs`` are imported from their modules: they pull in the
model registry and the pipeline, which the metrics alone do not need.
"""

from radserve.evaluation.lesions import (
    LESION_TYPES,
    SIZE_STRATA,
    GtLesion,
    StudyLesions,
    match_lesions,
    size_stratum,
)
from radserve.evaluation.metrics import dice, hd95
from radserve.evaluation.runner import (
    HELD_OUT_SEED_LIMIT,
    GroundTruth,
    Predictor,
    StudyPrediction,
    evaluate,
    parse_seeds,
    phantom_truth,
    score_study,
)
from radserve.evaluation.summary import EvalSummary, StudyScores, summarise

__all__ = [
    "HELD_OUT_SEED_LIMIT",
    "LESION_TYPES",
    "SIZE_STRATA",
    "EvalSummary",
    "GroundTruth",
    "GtLesion",
    "Predictor",
    "StudyLesions",
    "StudyPrediction",
    "StudyScores",
    "dice",
    "evaluate",
    "hd95",
    "match_lesions",
    "parse_seeds",
    "phantom_truth",
    "score_study",
    "size_stratum",
    "summarise",
]
