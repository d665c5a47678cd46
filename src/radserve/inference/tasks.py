"""What the engine hands to a device, and what every task shares.

A *task* is one study through one model, split into batches. The scheduler (or
:mod:`radserve.inference.runner`) pulls ``next_batch()``, runs it on a session and hands
the output back with ``accept()``; the task maps each output onto the native grid at
once, so nothing larger than a batch is held per class. Tasks never touch a session, so
batches of several studies can interleave on one device.

Thread contract: one thread calls ``next_batch`` and another ``accept``, possibly at the
same time; ``accept`` calls are never concurrent with each other.

Model outputs are assumed to be *logits*: the task applies ``spec.activation`` (a graph
declared ``activation_in_graph`` has its probabilities turned back into logits by the
session). A graph that already ends in Softmax/Sigmoid still gives the right labels for
softmax (argmax is unchanged) but squashed confidences, and wrong sigmoid thresholds
(every voxel labelled); install refuses one whose output comes from such a node
(:func:`radserve.lifecycle.graph_checks.probabilities_refusal`). What slips through (a
graph whose probabilities pass through other operators, one installed before that
check) is caught by the first batch: an output that looks like probabilities gives a
warning, logged and kept in the task's :attr:`BatchedTask.warnings`, which the
prediction carries into the step's report warnings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from radserve.domain.prediction import Prediction
from radserve.domain.volume import Volume
from radserve.errors import InferenceError, ModelError
from radserve.models.manifest import ModelSpec
from radserve.preprocess.crop import BBox, crop_volume

logger = logging.getLogger(__name__)

DEFAULT_MEMORY_BUDGET = 512 * 1024**2


class InferenceCancelledError(InferenceError):
    """A task was cancelled at a batch boundary; nothing it produced is returned."""

    code = "inference_cancelled"
    retryable = False


@dataclass(frozen=True, eq=False)
class Batch:
    """One device call: ``inputs`` (N, C, H, W) or (N, C, D, H, W) float32.

    ``items`` says where each sample came from (native slice indices for slice tasks,
    patch origins for patch tasks); only the task that made the batch reads it.
    """

    task: Task
    index: int
    items: tuple[Any, ...]
    inputs: np.ndarray


@runtime_checkable
class Task(Protocol):
    """The contract between an inference task and whoever drives it."""

    spec: ModelSpec

    @property
    def total_batches(self) -> int: ...

    @property
    def done(self) -> bool: ...

    def next_batch(self) -> Batch | None: ...

    def accept(self, batch: Batch, output: np.ndarray) -> None: ...

    def add_timing(self, stage: str, seconds: float) -> None: ...

    def finish(self, *, precision: str | None = None) -> Prediction: ...


@dataclass
class TaskState:
    """Counters and timings shared by the concrete tasks (guarded by one lock)."""

    total: int
    produced: int = 0
    accepted: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    checked_output: bool = False
    warnings: list[str] = field(default_factory=list)

    def add_timing(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def mark_accepted(self) -> None:
        with self.lock:
            self.accepted += 1

    @property
    def done(self) -> bool:
        return self.accepted >= self.total


class ForegroundBox:
    """The running box of the non-zero labels a task has written (updated per slice by
    :meth:`add`, which costs two ``any`` reductions of a mask the merge has anyway)."""

    def __init__(self) -> None:
        self._lo = [np.iinfo(np.int64).max] * 3
        self._hi = [-1] * 3

    def add(self, z: int, mask: np.ndarray, y0: int, x0: int) -> None:
        """Slice ``z``'s non-zero ``mask`` (2-D), whose element [0, 0] is at (y0, x0)."""
        rows = np.flatnonzero(mask.any(axis=1))
        if rows.size == 0:
            return
        cols = np.flatnonzero(mask.any(axis=0))
        spans = ((z, z), (y0 + rows[0], y0 + rows[-1]), (x0 + cols[0], x0 + cols[-1]))
        for axis, (lo, hi) in enumerate(spans):
            self._lo[axis] = min(self._lo[axis], int(lo))
            self._hi[axis] = max(self._hi[axis], int(hi))

    def box(self) -> BBox:
        """The box so far (empty when nothing was written)."""
        if self._hi[0] < 0:
            return (slice(0, 0), slice(0, 0), slice(0, 0))
        return tuple(slice(lo, hi + 1) for lo, hi in zip(self._lo, self._hi, strict=True))  # type: ignore[return-value]


class BatchedTask:
    """What the concrete tasks share: batch counting, timings, the first-output check and
    :meth:`finish`.

    A subclass sets ``spec``, ``volume``, ``precision``, ``batch_size``, ``labels`` and
    ``confidence`` (shaped like :meth:`_output_grid`'s grid), calls :meth:`_plan` with
    its work items (one per sample), and implements :meth:`_inputs` and ``accept``
    (which ends with :meth:`_accepted`).

    Where the outputs live: a task restricted to an ROI keeps its label and confidence
    maps at the ROI's size, on the ROI's box of the input grid (the prediction's affine
    says where; :func:`radserve.preprocess.crop.grid_offset` finds the box again).
    Everything outside is background by definition, and a lesion model's maps at full
    size would be the largest arrays of the run after the CT itself. Without an ROI
    the maps have the input's grid.
    """

    spec: ModelSpec
    volume: Volume
    precision: str
    batch_size: int
    labels: np.ndarray
    confidence: np.ndarray | None
    grid: Volume
    _out: BBox  # the crop, in the coordinates of the output maps (set by _output_grid)

    def _output_grid(self, box: BBox, roi_sized: bool) -> BBox:
        """Set :attr:`grid` (the input, or its ``box`` when ``roi_sized``) and ``_out``,
        ``box`` in the coordinates of the output maps, and return the latter."""
        if not roi_sized:
            self.grid = self.volume
            self._out = box
        else:
            self.grid = crop_volume(self.volume, box)
            self._out = tuple(slice(0, max(0, s.stop - s.start)) for s in box)  # type: ignore[assignment]
        return self._out

    def _plan(self, items: Sequence[Any]) -> None:
        """Split ``items`` into batches of ``batch_size``."""
        self._items = list(items)
        self._state = TaskState(total=-(-len(self._items) // self.batch_size))

    @property
    def total_batches(self) -> int:
        return self._state.total

    @property
    def done(self) -> bool:
        return self._state.done

    def add_timing(self, stage: str, seconds: float) -> None:
        self._state.add_timing(stage, seconds)

    def next_batch(self) -> Batch | None:
        """Prepare the next batch, or ``None`` when all have been handed out."""
        if self._state.produced >= self._state.total:
            return None
        t0 = time.perf_counter()
        start = self._state.produced * self.batch_size
        items = tuple(self._items[start : start + self.batch_size])
        inputs = self._inputs(items)
        batch = Batch(task=self, index=self._state.produced, items=items, inputs=inputs)
        self._state.produced += 1
        self._state.add_timing("prepare", time.perf_counter() - t0)
        return batch

    def _inputs(self, items: tuple[Any, ...]) -> np.ndarray:
        """The network input for ``items``: (N, C, spatial...) float32."""
        raise NotImplementedError

    def accept(self, batch: Batch, output: np.ndarray) -> None:
        """Merge one batch's output (N, classes, spatial...) into the native-grid result."""
        raise NotImplementedError

    def _check_first_output(self, output: np.ndarray) -> None:
        """Warn (once per task) when the first output looks like probabilities: logged,
        and kept in :attr:`warnings`."""
        if not self._state.checked_output:
            self._state.checked_output = True
            why = warn_if_probabilities(self.spec, output)
            if why is not None:
                with self._state.lock:
                    self._state.warnings.append(why)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What this task found wrong with the model's outputs without refusing them (an
        output that looks like probabilities), for the step's report warnings."""
        with self._state.lock:
            return tuple(self._state.warnings)

    def _accepted(self, started: float) -> None:
        """Count an accepted batch whose merge began at ``started`` (perf_counter)."""
        self._state.mark_accepted()
        self._state.add_timing("merge", time.perf_counter() - started)

    def _extent(self) -> BBox:
        """Where the labels can be non-zero, on the output grid: the crop, unless a task
        knows a tighter box."""
        return self._out

    def _complete(self) -> None:
        """Work that needs every batch, run by :meth:`finish` (nothing by default)."""

    def finish(self, *, precision: str | None = None) -> Prediction:
        """The prediction on :attr:`grid`; only valid once every batch has been accepted."""
        if not self.done:
            raise RuntimeError(
                f"task {self.spec.key} finished after {self._state.accepted} of "
                f"{self._state.total} batches"
            )
        self._complete()
        return Prediction(
            model=self.spec.name,
            model_version=self.spec.version,
            precision=precision or self.precision,
            labels=self.grid.with_array(self.labels),
            confidence=None if self.confidence is None else self.grid.with_array(self.confidence),
            timings=dict(self._state.timings),
            batches=self._state.total,
            extent=self._extent(),
            warnings=self.warnings,
        )


def check_batch(task: object, batch: Batch, output: np.ndarray, expected: tuple[int, ...]) -> None:
    """Refuse a batch from another task or an output of the wrong shape, naming the model
    and the axes that differ, with the fix (:func:`shape_mismatch`)."""
    if batch.task is not task:
        raise InferenceError("batch handed back to a task that did not make it")
    if output.shape != expected:
        spec = getattr(task, "spec", None)
        who = f"{spec.key}: " if isinstance(spec, ModelSpec) else ""
        raise ModelError(
            f"{who}model output has shape {output.shape}, expected {expected}: "
            + shape_mismatch(output.shape, expected)
        )


def shape_mismatch(actual: Sequence[int], expected: Sequence[int]) -> str:
    """Which axes of an output of shape ``actual`` differ from ``expected`` ((N, classes,
    spatial...), or (N, classes) for a classifier), each with the fix that fits it:
    before 2026-12-07 every mismatch was blamed on model.yaml's 'activation' and
    'labels', also a graph that crops its output to a fixed 32x32 (right for the 32-pixel
    probe, wrong for every wider study)."""
    actual, expected = tuple(actual), tuple(expected)
    if len(actual) != len(expected):
        layout = "(N, classes)" if len(expected) == 2 else "(N, classes, spatial...)"
        return (
            f"it has {len(actual)} axes, expected {len(expected)} {layout}: a segmentation "
            "or detection model answers one channel per class on the input's grid, a "
            "classification model one score vector per sample; check model.yaml 'task' "
            "and 'input.mode' against the graph"
        )
    parts = []
    if actual[0] != expected[0]:
        parts.append(
            f"batch axis {actual[0]} for {expected[0]} samples: the graph fixes or changes "
            "its batch size; export it with a dynamic batch axis"
        )
    if actual[1] != expected[1]:
        parts.append(
            f"{actual[1]} class channels, expected {expected[1]}: check model.yaml "
            "'activation' and 'labels' (softmax needs max label + 1 channels, sigmoid one "
            "per label; ignored_values count too)"
        )
    if actual[2:] != expected[2:]:
        got, want = ("x".join(map(str, dims)) for dims in (actual[2:], expected[2:]))
        parts.append(
            f"spatial size {got} for an input of {want}: the graph fixes its spatial size "
            "or crops, strides or resizes its output (a Slice or Resize to a constant size, "
            "a downsampling without its upsampling); it must answer on the input's grid, "
            "whatever its size"
        )
    return "; ".join(parts)


def nan_refusal(values: np.ndarray) -> str | None:
    """Why class probabilities ``values`` cannot decide labels (None: they can).

    ``values``: the winning probability per voxel (NaN wherever any class's is: NumPy's
    maximum carries a NaN through) or the probabilities themselves. A NaN compares false
    with every probability, so its voxel went to background (softmax) or below the
    threshold (sigmoid): a model whose logits were NaN (a NaN weight, a float16
    overflow), or one infinite logit under softmax (``inf - inf``), labelled every study
    empty with no error, "liver not found" reported as a normal result. Checked on what
    decides the labels (a voxel per class fewer than the logits), so a finite model pays
    one sum; infinite sigmoid logits, which decide as 0 and 1, stay allowed. The one
    rule inference (:func:`refuse_nan`) and the install probe
    (:func:`radserve.inference.probe.output_refusal`) judge by."""
    if not np.isnan(np.add.reduce(values, axis=None)):
        return None
    count = int(np.count_nonzero(np.isnan(values)))
    return (
        f"its output gives NaN class probabilities at {count} of {values.size} "
        "values (NaN logits, or an infinite logit under softmax: a NaN or overflowing "
        "weight, a float16 overflow, a division by zero in the graph); a model's logits "
        "must be finite, and no labels are made from these"
    )


def refuse_nan(spec: ModelSpec, values: np.ndarray) -> None:
    """Refuse class probabilities holding NaN where labels are decided from them
    (:func:`nan_refusal`), naming the model."""
    why = nan_refusal(values)
    if why is not None:
        raise ModelError(f"{spec.key}: {why}")


def probabilities_warning(spec: ModelSpec, output: np.ndarray) -> str | None:
    """Why ``output`` (a task's first batch, as the session returns it) looks like
    probabilities where logits belong, or None. Weaker evidence than a graph ending in
    a Sigmoid/Softmax node (install refuses that): one batch of logits may lie in [0, 1]
    by chance, so it is a warning, never a refusal."""
    if output.size == 0:
        return None
    lo, hi = float(output.min()), float(output.max())
    if lo < 0.0 or hi > 1.0:
        return None
    if spec.activation == "softmax" and not np.allclose(output.sum(axis=1), 1.0, atol=1e-3):
        return None
    if spec.activation == "sigmoid":
        effect = "sigmoid of a probability is at least 0.5: voxels may be labelled everywhere"
    else:
        effect = "the labels hold, but confidences are squashed toward 1/classes"
    return (
        f"model {spec.key}'s output lies in [0, 1]"
        f"{' and sums to 1 over classes' if spec.activation == 'softmax' else ''}: it looks "
        f"like probabilities, but radserve applies {spec.activation} to it as logits "
        f"({effect}); if the graph applies its activation itself, its model.yaml needs "
        "`activation_in_graph: true`, else export it without its final activation"
    )


def warn_if_probabilities(spec: ModelSpec, output: np.ndarray) -> str | None:
    """Log :func:`probabilities_warning`'s warning, if any, and return it."""
    why = probabilities_warning(spec, output)
    if why is not None:
        logger.warning("%s", why)
    return why


def activate(logits: np.ndarray, activation: str, axis: int = 1) -> np.ndarray:
    """Softmax or sigmoid over the class axis, in float32, in place where possible."""
    x = np.asarray(logits, dtype=np.float32)
    if activation == "softmax":
        x = x - x.max(axis=axis, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(axis=axis, keepdims=True)
        return x
    if activation == "sigmoid":
        x = -x
        with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x: p = 0
            np.exp(x, out=x)
        x += 1.0
        np.reciprocal(x, out=x)
        return x
    raise ModelError(f"unknown activation {activation!r}; expected 'softmax' or 'sigmoid'")


def decide(probs: np.ndarray, spec: ModelSpec, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Class probabilities -> (uint8 label values, uint8 winning probability x 255).

    Softmax: channel c is label value c, 0 is background. Sigmoid: channel c is label
    value c + 1; the most probable label wins where it reaches
    ``postprocess.threshold``, else background with confidence ``1 - max p``.
    NaN probabilities are refused (:func:`refuse_nan`).
    """
    winner, best = running_winner(probs, axis)
    refuse_nan(spec, best)
    return finish_decision(winner, best, spec)


def running_winner(probs: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 index of the most probable channel, its float32 probability).

    A running maximum over the (few) classes: much faster than argmax along a
    non-contiguous axis, and the first class wins ties, as with argmax.
    """
    channels = np.moveaxis(probs, axis, 0)
    best = np.array(channels[0], dtype=np.float32, copy=True)
    winner = np.zeros(best.shape, np.uint8)
    better = np.empty(best.shape, bool)
    for c in range(1, channels.shape[0]):
        # copyto(where=) and out=: no boolean-index scatter and no new mask per class
        np.greater(channels[c], best, out=better)
        np.copyto(winner, np.uint8(c), where=better)
        np.maximum(best, channels[c], out=best)
    return winner, best


def finish_decision(
    winner: np.ndarray, best: np.ndarray, spec: ModelSpec
) -> tuple[np.ndarray, np.ndarray]:
    """Winning channel and probability -> (label values, confidence) per ``decide``.

    Modifies ``winner`` and ``best`` in place.
    """
    if spec.activation == "softmax":
        return winner, to_uint8(best)
    fg = best >= spec.threshold
    winner += 1
    winner[~fg] = 0
    best[~fg] = 1.0 - best[~fg]
    return winner, to_uint8(best)


def to_uint8(p: np.ndarray) -> np.ndarray:
    """Probability in [0, 1] -> 0..255, rounded half up."""
    out = np.clip(p, 0.0, 1.0) * np.float32(255.0)
    out += np.float32(0.5)
    return out.astype(np.uint8)


def pick_batch_size(
    requested: int, per_item_bytes: int, budget_bytes: int | None, device_max: int | None = None
) -> int:
    """``requested`` (at most ``device_max``: :attr:`RuntimeChoice.max_batch_size`)
    reduced so one batch's working set fits ``budget_bytes`` (at least 1)."""
    if device_max is not None:
        requested = min(requested, device_max)
    budget = DEFAULT_MEMORY_BUDGET if budget_bytes is None else budget_bytes
    fits = max(1, budget // max(1, per_item_bytes))
    if fits < requested:
        logger.info(
            "batch size %d -> %d to stay within %.0f MiB (%.1f MiB per item)",
            requested,
            fits,
            budget / 2**20,
            per_item_bytes / 2**20,
        )
    return int(min(requested, fits))
