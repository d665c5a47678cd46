"""The shipped reference models reach the project floors on held-out phantoms.

Two full-size held-out studies (seeds 8 and 10: 174 and 145 slices, 10 lesions between
them, 5-40 mm), run through the real reference pipeline exactly as ``radserve
evaluate`` runs it. Two studies are a smoke-level check of the floors, kept small for
CI; the published figures (README, model cards) come from ``radserve evaluate`` on
seeds 0-19.
"""

from __future__ import annotations

import json

import pytest

from radserve.commands.evaluate import DEFAULT_PIPELINE, pipeline_specs
from radserve.domain.accuracy import (
    LESION_MAX_FP_PER_STUDY,
    LESION_RECALL_FLOORS,
    ORGAN_MEAN_DICE_FLOOR,
)
from radserve.evaluation.pipeline_runs import organ_label_values, pipeline_predictor
from radserve.evaluation.runner import evaluate
from radserve.models.registry import ModelRegistry, bundled_model_dir
from radserve.pipeline.spec import load_pipeline

SEEDS = (8, 10)


@pytest.fixture(scope="module")
def summary():
    registry = ModelRegistry([bundled_model_dir()])
    specs = pipeline_specs(registry, DEFAULT_PIPELINE)
    summaries = evaluate(
        pipeline_predictor(registry, DEFAULT_PIPELINE),
        seeds=SEEDS,
        organ_labels=organ_label_values(specs),
        small=False,
    )
    return summaries["fp32"]


def test_organ_mean_dice_floor(summary) -> None:
    assert summary.dice_mean >= ORGAN_MEAN_DICE_FLOOR, summary.dice


def test_lesion_recall_floors_and_false_positives(summary) -> None:
    n, hit = summary.n_lesions_by_size, summary.n_detected_by_size
    large = n.get("10-20", 0) + n.get(">20", 0)
    found_large = hit.get("10-20", 0) + hit.get(">20", 0)
    assert large >= 3 and n.get("5-10", 0) >= 3, n  # the seeds exercise both floors
    assert found_large / large >= LESION_RECALL_FLOORS[">=10mm"], (hit, n)
    assert hit["5-10"] / n["5-10"] >= LESION_RECALL_FLOORS["5-10mm"], (hit, n)
    # The FP floor is an average over the evaluation set (0.55 for lesions 1.2.0 over
    # seeds 0-19, checked below from the bundle's record); two studies only bound it.
    assert summary.fp_per_study <= 2 * LESION_MAX_FP_PER_STUDY, summary.fp_per_study


def test_the_published_held_out_evaluation_meets_the_floors() -> None:
    """The 20-study `radserve evaluate` recorded in the served lesion bundle (what the
    README and model card publish) meets every floor, for the model the pipeline serves."""
    registry = ModelRegistry([bundled_model_dir()])
    step = next(s for s in load_pipeline(DEFAULT_PIPELINE).steps if s.model == "lesions")
    bundle = registry.get(step.model, step.version)
    log = json.loads((bundle.directory / "training_log.json").read_text())
    recorded = log["evaluation"]["summary"]
    assert recorded["n_studies"] >= 20 and max(recorded["seeds"]) < 900
    recall = recorded["recall_by_size"]
    assert min(recall["10-20"], recall[">20"]) >= LESION_RECALL_FLOORS[">=10mm"]
    assert recall["5-10"] >= LESION_RECALL_FLOORS["5-10mm"]
    assert recorded["fp_per_study"] <= LESION_MAX_FP_PER_STUDY
    assert recorded["dice_mean"] >= ORGAN_MEAN_DICE_FLOOR
