"""Classification models: slice batches in, one probability per class for the study out.

The slices are prepared exactly as for a 2D / 2.5D segmentation model
(:class:`~radserve.inference.slices.SliceTask`: crop to the ROI or body, the model's
preprocess ops, in-plane resampling, 2.5D context, normalisation, padding), but the
network answers each slice with a score vector (N, classes) instead of a map. The
activation turns each vector into probabilities, and each class's probability is
combined over the slices (``classification.aggregate``: the mean, or the maximum for a
sign seen on a few slices). The label map stays all background (untouched zero pages:
no memory); what the step found is :attr:`Prediction.class_probabilities`.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from radserve.domain.prediction import Prediction
from radserve.errors import ModelError
from radserve.inference.slices import SliceTask
from radserve.inference.tasks import Batch, activate, check_batch, refuse_nan


class ClassificationTask(SliceTask):
    """One study through one classification model, as a sequence of slice batches."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if not self.spec.is_classifier:
            raise ModelError(f"model {self.spec.key} is not a classification model")
        self.confidence = None
        k = self.spec.num_classes
        self._sum = np.zeros(k, np.float64)
        self._max = np.zeros(k, np.float64)
        self._slices = 0

    def accept(self, batch: Batch, output: np.ndarray) -> None:
        """Add one batch's class probabilities to the study's running sum and maximum."""
        t0 = time.perf_counter()
        n, k = len(batch.items), self.spec.num_classes
        check_batch(self, batch, output, (n, k))
        self._check_first_output(output)
        probs = activate(output, self.spec.activation, axis=1)
        refuse_nan(self.spec, probs)
        self._sum += probs.sum(axis=0, dtype=np.float64)
        np.maximum(self._max, probs.max(axis=0), out=self._max)
        self._slices += n
        self._accepted(t0)

    def finish(self, *, precision: str | None = None) -> Prediction:
        """The all-background map plus the aggregated probability of each channel."""
        prediction = super().finish(precision=precision)
        if self.spec.classifying.aggregate == "max":
            probabilities = self._max
        else:
            probabilities = self._sum / max(1, self._slices)
        return dataclasses.replace(
            prediction,
            class_probabilities=tuple(float(p) for p in probabilities),
            slices=self._slices,
            extent=(slice(0, 0), slice(0, 0), slice(0, 0)),
        )


__all__ = ["ClassificationTask"]
