"""Run one study through one pipeline: files in, measured findings and a report out.

Synchronous and free of web/network code: the CLI, the benchmark, the evaluation and
(later) the scheduler's workers all call :func:`run_study` or :func:`run_volume`.
The stages follow the data flow: ingest -> (per model step) preprocess + inference
-> postprocess -> report files.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from radserve.domain import Finding, OrganMeasurement, Prediction, Volume
from radserve.errors import PipelineError
from radserve.inference import (
    ModelSession,
    RuntimeChoice,
    Task,
    choose_runtime,
    make_task,
    run_task,
    run_task_overlapped,
)
from radserve.models.manifest import ModelSpec, Precision
from radserve.models.registry import ModelBundle, ModelRegistry
from radserve.pipelines.spec import PipelineSpec
from radserve.postprocess.components import clean_label_map
from radserve.postprocess.diameters import FindingAxes
from radserve.postprocess.findings import find_lesions, organ_measurements
from radserve.preprocess.crop import BBox, roi_bbox
from radserve.progress import ProgressSink, StageTimer

logger = logging.getLogger(__name__)

_EMPTY_BOX: BBox = (slice(0, 0), slice(0, 0), slice(0, 0))


def _load_malloc_trim() -> Callable[[int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> None:
    """Hand memory that is already freed back to the operating system (glibc only).

    The stages allocate and free many arrays of a few MB on several threads (prepare,
    merge, ONNX Runtime's pool); glibc keeps such freed blocks in per-thread arenas,
    so without this the resident size after each stage stays at that stage's peak and
    the next stage's peak lands on top of it. Called between model steps and before
    the report; costs about a millisecond. Frees nothing that is still in use.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class SessionPool:
    """ONNX Runtime sessions, one per (model file, precision), created on first use.

    Creating a session costs far more than one batch; the CLI, the benchmark, the
    evaluation loop and the server's workers keep one pool and reuse it.
    """

    def __init__(self, runtime: RuntimeChoice | None = None) -> None:
        self.runtime = runtime or choose_runtime()
        self._sessions: dict[tuple[str, str], ModelSession] = {}
        self._lock = threading.Lock()

    def get(self, bundle: ModelBundle, precision: str) -> ModelSession:
        path = bundle.onnx_path(precision)
        key = (str(path), precision)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                session = ModelSession(path, bundle.spec, runtime=self.runtime, precision=precision)
                self._sessions[key] = session
            return session


@dataclass(frozen=True)
class StepResult:
    """What one model step produced.

    ``labels`` is on the input volume's grid, or, for a model restricted to an ROI
    (``input.roi_labels``), on that ROI's box of it (its affine says where); findings,
    axes and ``finding_labels`` are always on the input volume's grid.
    """

    bundle: ModelBundle
    precision: str
    labels: Volume
    execution_provider: str
    organs: list[OrganMeasurement] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    finding_labels: Volume | None = None
    finding_axes: list[FindingAxes] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    label_boxes: tuple[BBox | None, ...] = ()  # of each value 1..max in ``labels``
    # The served variant's accuracy gate did not cover the provider it ran on.
    gate_warning: str | None = None


@dataclass(frozen=True)
class VolumeResult:
    """The pipeline's answer for one volume, before any file is written."""

    steps: list[StepResult]
    timings: dict[str, float]

    @property
    def organ_step(self) -> StepResult | None:
        organ_steps = [s for s in self.steps if s.organs]
        return organ_steps[-1] if organ_steps else None

    @property
    def lesion_step(self) -> StepResult | None:
        lesion_steps = [s for s in self.steps if s.finding_labels is not None]
        return lesion_steps[-1] if lesion_steps else None

    @property
    def findings(self) -> list[Finding]:
        step = self.lesion_step
        return list(step.findings) if step else []

    @property
    def organ_measurements(self) -> list[OrganMeasurement]:
        step = self.organ_step
        return list(step.organs) if step else []

    @property
    def warnings(self) -> list[str]:
        return [w for s in self.steps for w in s.warnings]

    @property
    def gate_warnings(self) -> list[str]:
        return [s.gate_warning for s in self.steps if s.gate_warning]


def _organ_names(spec: ModelSpec) -> dict[int, str]:
    return {label.value: label.name for label in spec.labels if label.kind == "organ"}


def _roi(spec: ModelSpec, organs: StepResult | None, volume: Volume) -> BBox | None:
    """Bounding box of the upstream labels a model restricts its search to."""
    wanted = spec.input.roi_labels
    if not wanted:
        return None
    if organs is None:
        raise PipelineError(
            f"model {spec.key} needs upstream labels {list(wanted)} but no earlier "
            "pipeline step produced organ labels; put an organ model before it"
        )
    names = _organ_names(organs.bundle.spec)
    values = [v for v, n in names.items() if n in wanted]
    missing = set(wanted) - set(names.values())
    if missing:
        raise PipelineError(
            f"model {spec.key} restricts to {sorted(missing)}, which "
            f"{organs.bundle.spec.key} does not produce"
        )
    boxes = organs.label_boxes or None
    return roi_bbox(organs.labels, values, spec.input.roi_margin_mm, boxes) or _EMPTY_BOX


def _extra_channels(spec: ModelSpec, organs: StepResult | None) -> dict[str, np.ndarray] | None:
    if not spec.input.extra_channels:
        return None
    if organs is None:
        raise PipelineError(f"model {spec.key} needs upstream masks; no organ step ran")
    by_name = {n: v for v, n in _organ_names(organs.bundle.spec).items()}
    return {name: organs.labels.array == by_name[name] for name in spec.input.extra_channels}


@dataclass(frozen=True)
class PendingStep:
    """A model step ready to run: its batch-level task and the session to run it on."""

    bundle: ModelBundle
    session: ModelSession
    task: Task


class VolumeRun:
    """One volume through a pipeline, one model step at a time, as batch-level tasks.

    The scheduler interleaves batches of many runs: it asks :meth:`next_step` for a
    task, feeds its batches to the session (with batches of other studies in between),
    and hands the finished :class:`Prediction` to :meth:`complete_step`, which
    post-processes it and makes the next step's inputs (ROI, upstream masks) available.
    :func:`run_volume` is the same loop for one study on the calling thread.
    """

    def __init__(
        self,
        ct: Volume,
        pipeline: PipelineSpec,
        *,
        registry: ModelRegistry,
        sessions: SessionPool,
        precision: Precision | None = None,
    ) -> None:
        self.ct = ct
        self.pipeline = pipeline
        self.precision: str = precision or pipeline.precision
        self._registry = registry
        self._sessions = sessions
        self._next = 0
        self._pending: PendingStep | None = None
        self.steps: list[StepResult] = []
        self.timings: dict[str, float] = {}

    @property
    def done(self) -> bool:
        return self._next >= len(self.pipeline.steps) and self._pending is None

    @property
    def _organs(self) -> StepResult | None:
        organ_steps = [s for s in self.steps if s.organs]
        return organ_steps[-1] if organ_steps else None

    def next_step(self) -> PendingStep | None:
        """The next model step's task (None when every step has run)."""
        if self._pending is not None:
            raise PipelineError("complete the pending step before asking for the next one")
        if self._next >= len(self.pipeline.steps):
            return None
        step = self.pipeline.steps[self._next]
        self._next += 1
        bundle = self._registry.get(step.model, step.version)
        spec = bundle.spec
        t0 = time.perf_counter()
        session = self._sessions.get(bundle, self.precision)
        self.timings[f"{spec.name}: load model"] = time.perf_counter() - t0
        organs = self._organs
        task = make_task(
            self.ct,
            spec,
            _roi(spec, organs, self.ct),
            _extra_channels(spec, organs),
            max_batch_size=session.runtime.max_batch_size,
        )
        self._pending = PendingStep(bundle, session, task)
        return self._pending

    def complete_step(self, prediction: Prediction) -> StepResult:
        """Post-process the pending step's prediction; the next step may then start."""
        pending = self._pending
        if pending is None:
            raise PipelineError("no step is pending")
        spec = pending.bundle.spec
        t0 = time.perf_counter()
        release_free_memory()  # what inference's threads freed, before post-processing
        cleaned = clean_label_map(
            prediction.labels.array,
            spec,
            self.ct.voxel_volume_ml,
            in_place=True,
            within=prediction.extent,
        )
        prediction = dataclasses.replace(
            prediction, labels=prediction.labels.with_array(cleaned.labels)
        )
        result = _step_result(
            pending.bundle,
            self.precision,
            pending.session,
            prediction,
            self.ct,
            self._organs,
            cleaned.boxes,
        )
        for name, seconds in prediction.timings.items():
            if name != "wall":
                self.timings[f"{spec.name}: {name}"] = seconds
        self.timings[f"{spec.name}: postprocess"] = time.perf_counter() - t0
        self.steps.append(result)
        self._pending = None
        return result

    def result(self) -> VolumeResult:
        if not self.done:
            raise PipelineError("the pipeline has steps left to run")
        return VolumeResult(steps=list(self.steps), timings=dict(self.timings))


def run_volume(
    ct: Volume,
    pipeline: PipelineSpec,
    *,
    registry: ModelRegistry,
    sessions: SessionPool,
    precision: Precision | None = None,
    cancel: threading.Event | None = None,
    progress: ProgressSink | None = None,
    overlapped: bool = True,
) -> VolumeResult:
    """Every model step of ``pipeline`` on one volume; outputs on the volume's grid."""
    timer = StageTimer(progress)
    run = VolumeRun(ct, pipeline, registry=registry, sessions=sessions, precision=precision)
    runner = run_task_overlapped if overlapped else run_task
    while (pending := run.next_step()) is not None:
        stage = f"{pending.bundle.spec.name}: inference"
        with timer.stage(stage, total=pending.task.total_batches):
            prediction = runner(
                pending.task,
                pending.session,
                cancel=cancel,
                progress=lambda done, total, s=stage: timer.progress.advance(s),
            )
        run.complete_step(prediction)
        # Drop the raw task and prediction now: they hold full-volume arrays that the
        # next step's task would otherwise sit beside (peak memory).
        del pending, prediction
        release_free_memory()
    result = run.result()
    return VolumeResult(steps=result.steps, timings={**result.timings, **timer.seconds})


def _step_result(
    bundle: ModelBundle,
    precision: str,
    session: ModelSession,
    prediction: Prediction,
    ct: Volume,
    organs: StepResult | None,
    boxes: tuple[BBox | None, ...],
) -> StepResult:
    """Measurements of one cleaned prediction (``boxes``: of each of its label values)."""
    spec = bundle.spec
    kinds = {label.kind for label in spec.labels}
    labels = prediction.labels
    provider = session.providers_in_use[0]
    uncovered = bundle.gate_coverage(precision, provider)
    if uncovered:
        logger.warning("%s", uncovered)
    result = StepResult(
        bundle,
        precision,
        labels,
        provider,
        organs=organ_measurements(labels, ct, spec, boxes) if "organ" in kinds else [],
        label_boxes=boxes,
        gate_warning=uncovered,
    )
    if "lesion" not in kinds:
        return result
    lesions = find_lesions(
        prediction,
        ct,
        spec,
        organs.labels if organs else None,
        _organ_names(organs.bundle.spec) if organs else None,
    )
    return dataclasses.replace(
        result,
        findings=lesions.findings,
        finding_labels=lesions.label_map,
        finding_axes=lesions.axes,
        warnings=list(lesions.warnings),
    )
