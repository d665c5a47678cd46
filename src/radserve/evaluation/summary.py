"""Per-study scores and their summary over a set of held-out studies.

Recall and precision are fractions in [0, 1]; the gate speaks of *points*, i.e. 100 times
a difference of fractions. ``None`` means "undefined" (no GT lesions in a stratum, no
organ in any study, no predicted component at all) and is never silently turned into 0
or 1. The summary holds only finite numbers or ``None``, so it serialises to strict JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from radserve.domain.accuracy import EvalSummary
from radserve.evaluation.lesions import LESION_TYPES, SIZE_STRATA, StudyLesions

__all__ = ["EvalSummary", "StudyScores", "summarise"]


@dataclass(frozen=True)
class StudyScores:
    """Everything measured on one study at one precision."""

    seed: int
    dice: Mapping[str, float]
    hd95: Mapping[str, float]
    lesions: StudyLesions
    predict_seconds: float = 0.0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def summarise(studies: Sequence[StudyScores], *, variant: str = "fp32") -> EvalSummary:
    """Pool per-study scores: organ metrics averaged over studies, lesion counts pooled."""
    if not studies:
        raise ValueError("cannot summarise an evaluation with no studies")
    notes: list[str] = []
    organs = list(dict.fromkeys(name for s in studies for name in s.dice))

    dice: dict[str, float | None] = {}
    hd95: dict[str, float | None] = {}
    for organ in organs:
        d = [s.dice[organ] for s in studies if organ in s.dice and not math.isnan(s.dice[organ])]
        dice[organ] = _mean(d)
        if len(d) < len(studies):
            notes.append(
                f"dice {organ}: {len(studies) - len(d)} of {len(studies)} studies have the "
                "organ in neither GT nor prediction (undefined, skipped)"
            )
        h = [s.hd95.get(organ, math.nan) for s in studies]
        finite = [v for v in h if math.isfinite(v)]
        hd95[organ] = _mean(finite)
        missing = sum(math.isinf(v) for v in h)
        if missing:
            notes.append(
                f"hd95 {organ}: {missing} of {len(studies)} studies have the organ in only "
                "one of GT and prediction (infinite, excluded from the mean)"
            )
    defined = [v for v in dice.values() if v is not None]

    outcomes = [o for s in studies for o in s.lesions.outcomes]
    kinds = list(dict.fromkeys([*LESION_TYPES, *(o.kind for o in outcomes)]))
    n_by_size = {k: sum(o.stratum == k for o in outcomes) for k in SIZE_STRATA}
    tp_by_size = {k: sum(o.stratum == k and o.detected for o in outcomes) for k in SIZE_STRATA}
    n_by_type = {k: sum(o.kind == k for o in outcomes) for k in kinds}
    tp_by_type = {k: sum(o.kind == k and o.detected for o in outcomes) for k in kinds}
    for stratum, n in n_by_size.items():
        if n == 0:
            notes.append(f"recall {stratum} mm: no GT lesions in this stratum (skipped)")

    n_predicted = sum(s.lesions.n_predicted for s in studies)
    n_fp = sum(s.lesions.n_false_positive for s in studies)
    return EvalSummary(
        variant=variant,
        n_studies=len(studies),
        seeds=[s.seed for s in studies],
        dice_mean=_mean(defined),
        dice=dice,
        hd95=hd95,
        recall_by_size={k: _ratio(tp_by_size[k], n_by_size[k]) for k in SIZE_STRATA},
        recall_by_type={k: _ratio(tp_by_type[k], n_by_type[k]) for k in kinds},
        n_lesions_by_size=n_by_size,
        n_detected_by_size=tp_by_size,
        n_lesions_by_type=n_by_type,
        precision=_ratio(n_predicted - n_fp, n_predicted),
        fp_per_study=n_fp / len(studies),
        n_predicted=n_predicted,
        mean_predict_seconds=_mean([s.predict_seconds for s in studies]),
        notes=notes,
    )
