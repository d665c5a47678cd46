"""ClassificationTask: per-slice score vectors combined into one probability per class
(mean or max over the slices read), for softmax and sigmoid outputs; the shape of a
wrong output is refused. Hand-made logits stand in for the network."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radserve.domain.volume import Volume
from radserve.errors import ModelError
from radserve.inference import ClassificationTask, make_task
from radserve.models.manifest import ModelSpec


def _spec(activation: str = "softmax", aggregate: str = "mean", labels: int = 2) -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "cls", "version": "1", "task": "classification", "modality": "CT",
            "activation": activation,
            "input": {"mode": "2d", "spacing": [None, 1.0, 1.0], "crop": "none",
                      "batch_size": 2, "normalisation": {"kind": "ct_window", "center": 0,
                                                         "width": 2000}},
            "classification": {"aggregate": aggregate},
            "labels": [
                {"value": v, "name": f"c{v}", "concept": {"value": str(v), "meaning": f"c{v}"},
                 "category": {"value": "0", "meaning": "x"}}
                for v in range(1, labels + 1)
            ],
        }
    )  # fmt: skip


def _run(task: Any, logits: np.ndarray) -> tuple[float, ...]:
    """Feed ``logits`` (one row per slice, slice order) as the network's answers."""
    row = 0
    while (batch := task.next_batch()) is not None:
        task.accept(batch, logits[row : row + len(batch.items)])
        row += len(batch.items)
    prediction = task.finish()
    assert not prediction.labels.array.any() and prediction.slices == len(logits)
    return prediction.class_probabilities  # type: ignore[no-any-return]


VOLUME = Volume.from_geometry(np.zeros((4, 8, 8), np.int16), spacing=(2.0, 1.0, 1.0))


@pytest.mark.parametrize("aggregate", ["mean", "max"])
def test_softmax_scores_are_combined_over_the_slices(aggregate: str) -> None:
    task = make_task(VOLUME, _spec(aggregate=aggregate))
    assert isinstance(task, ClassificationTask)
    logits = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.6, 0.3, 0.1], [1, 1, 2]]))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    want = probs.mean(axis=0) if aggregate == "mean" else probs.max(axis=0)
    np.testing.assert_allclose(_run(task, logits.astype(np.float32)), want, rtol=1e-5)


def test_sigmoid_scores_are_one_per_label() -> None:
    task = make_task(VOLUME, _spec("sigmoid", "max"))
    logits = np.array([[0.0, -2.0], [2.0, -1.0], [-1.0, 0.0], [-3.0, -3.0]], np.float32)
    np.testing.assert_allclose(_run(task, logits), 1 / (1 + np.exp(-logits.max(0))), rtol=1e-5)


def test_an_output_that_is_not_one_vector_per_slice_is_refused() -> None:
    task = make_task(VOLUME, _spec())
    batch = task.next_batch()
    assert batch is not None
    with pytest.raises(ModelError, match="expected"):
        task.accept(batch, np.zeros((len(batch.items), 3, 8, 8), np.float32))  # a map
