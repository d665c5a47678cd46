"""One volume through a pipeline's model steps: a volume in, labels and findings out.

Synchronous and free of web/network code. Per step: preprocess + inference (a batch-level
:class:`~radserve.inference.Task`) -> postprocess (clean the label map, measure organs,
find lesions) -> the next step's inputs (ROI, upstream masks). :class:`VolumeRun` hands
out the steps one at a time (the scheduler interleaves their batches with other
studies'); :func:`run_volume` is the same loop on the calling thread (CLI, evaluation).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from radserve.domain import Classification, Finding, OrganMeasurement, Prediction, Volume
from radserve.errors import PipelineError, StudyError
from radserve.heap import release_free_memory
from radserve.host import usable_cores
from radserve.inference import (
    ArrivingSlices,
    ModelSession,
    RuntimeChoice,
    SessionRef,
    Task,
    choose_runtime,
    make_task,
    run_task,
    run_task_overlapped,
)
from radserve.models.manifest import ModelSpec, Precision
from radserve.models.registry import ModelBundle, ModelRegistry
from radserve.pipeline.channels import ChannelInputs
from radserve.pipeline.checks import check_pipeline
from radserve.pipeline.spec import PipelineSpec, Step
from radserve.pipeline.undeclared import undeclared_class_warning, undeclared_voxels_warning
from radserve.postprocess.components import clean_label_map
from radserve.postprocess.diameters import FindingAxes
from radserve.postprocess.findings import find_lesions, organ_measurements
from radserve.preprocess.crop import BBox, bbox_union, grid_offset, roi_bbox
from radserve.preprocess.resample import DEFAULT_MAX_VOXELS
from radserve.progress import ProgressSink, StageTimer

logger = logging.getLogger(__name__)

_EMPTY_BOX: BBox = (slice(0, 0), slice(0, 0), slice(0, 0))


class SessionPool:
    """ONNX Runtime sessions, one per (model file, precision), created on first use.

    Creating a session costs far more than one batch; the CLI, the benchmark, the
    evaluation loop and the server's workers keep one pool and reuse it. ``remote``:
    the sessions run on other processes (the Ray executor's workers load them), so the
    pool holds :class:`SessionRef` descriptions and loads nothing here.
    """

    def __init__(self, runtime: RuntimeChoice | None = None, *, remote: bool = False) -> None:
        self.runtime = runtime or choose_runtime()
        self.remote = remote
        self._sessions: dict[tuple[str, str], ModelSession | SessionRef] = {}
        self._lock = threading.Lock()

    def get(self, bundle: ModelBundle, precision: str) -> ModelSession | SessionRef:
        path = bundle.onnx_path(precision)
        key = (str(path), precision)
        kind = SessionRef if self.remote else ModelSession
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                session = kind(path, bundle.spec, runtime=self.runtime, precision=precision)
                self._sessions[key] = session
            return session

    def loaded(self) -> list[ModelSession]:
        """The sessions loaded now (``radserve doctor`` reports their memory)."""
        with self._lock:
            return list(self._sessions.values())

    def release(self, keep: set[str]) -> list[str]:
        """Drop the sessions of model files whose folder is not in ``keep`` (bundle
        directories still deployed or used by a job): their memory goes back once no
        study holds them. Returns the dropped files."""
        with self._lock:
            dropped = [k for k in self._sessions if str(Path(k[0]).parent) not in keep]
            for key in dropped:
                del self._sessions[key]
        return [k[0] for k in dropped]


@dataclass(frozen=True)
class StepResult:
    """What one model step produced.

    ``labels`` is on the input volume's grid, or, for a model restricted to an ROI
    (``input.roi_labels``), on that ROI's box of it (its affine says where); findings,
    axes and ``finding_labels`` are always on the input volume's grid. ``organs`` holds
    the measurements of the step's region labels (organ/structure), ``findings`` those
    of its finding labels (lesion/finding), numbered after the earlier steps' findings.
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
    step: Step | None = None  # the pipeline step (name, output); None outside a pipeline
    # A classification step's answer (its ``labels`` are all background, never written)
    classification: Classification | None = None

    @property
    def name(self) -> str:
        return self.step.step_name if self.step else self.bundle.spec.name

    @property
    def output(self) -> str:
        return self.step.output_stem if self.step else self.name

    @property
    def has_regions(self) -> bool:
        return bool(self.bundle.spec.region_labels)

    def labels_on(self, ct: Volume) -> Volume:
        """``labels`` on ``ct``'s grid: a step restricted to an ROI returns its map on
        the ROI's box, and every label map of a report lies on the report's geometry."""
        if self.labels.shape == ct.shape:
            return self.labels
        offset = grid_offset(self.labels, ct)
        if offset is None:
            raise StudyError("a step's label map is neither on the study's grid nor a box of it")
        full = np.zeros(ct.shape, dtype=self.labels.array.dtype)
        box = tuple(slice(o, o + n) for o, n in zip(offset, self.labels.shape, strict=True))
        full[box] = self.labels.array
        return ct.with_array(full)


@dataclass(frozen=True)
class VolumeResult:
    """The pipeline's answer for one volume, before any file is written: every step's
    labels, measurements and findings (findings numbered 1..n across the steps)."""

    steps: list[StepResult]
    timings: dict[str, float]
    # of each timing, the seconds paused for URGENT work (StageTimer.paused)
    paused: dict[str, float] = field(default_factory=dict)

    @property
    def organ_step(self) -> StepResult | None:
        """The last step with region labels (the reference pipeline's organ step)."""
        organ_steps = [s for s in self.steps if s.has_regions]
        return organ_steps[-1] if organ_steps else None

    @property
    def lesion_step(self) -> StepResult | None:
        """The last step with finding labels (the reference pipeline's lesion step)."""
        lesion_steps = [s for s in self.steps if s.finding_labels is not None]
        return lesion_steps[-1] if lesion_steps else None

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.steps for f in s.findings]

    @property
    def finding_axes(self) -> list[FindingAxes]:
        return [a for s in self.steps for a in s.finding_axes]

    @property
    def organ_measurements(self) -> list[OrganMeasurement]:
        return [m for s in self.steps for m in s.organs]

    @property
    def classifications(self) -> list[Classification]:
        return [s.classification for s in self.steps if s.classification is not None]

    @property
    def warnings(self) -> list[str]:
        return [w for s in self.steps for w in s.warnings]

    @property
    def gate_warnings(self) -> list[str]:
        return [s.gate_warning for s in self.steps if s.gate_warning]


def _region_names(spec: ModelSpec) -> dict[int, str]:
    return {label.value: label.name for label in spec.region_labels}


def _sources(steps: list[StepResult], names: tuple[str, ...]) -> dict[str, tuple[StepResult, int]]:
    """The earlier step and label value each of ``names`` refers to (the latest step that
    produces it as a region label; :func:`~radserve.pipeline.checks.check_pipeline`
    refuses a pipeline where that is not exactly one step)."""
    out: dict[str, tuple[StepResult, int]] = {}
    for step in steps:
        for value, name in _region_names(step.bundle.spec).items():
            if name in names:
                out[name] = (step, value)
    return out


def _missing(
    spec: ModelSpec, what: str, names: tuple[str, ...], found: Mapping[str, object]
) -> None:
    missing = sorted(set(names) - set(found))
    if missing:
        raise PipelineError(
            f"model {spec.key} needs upstream labels {missing} ({what}) but no earlier "
            "pipeline step produced them as organ/structure labels; put a model that "
            "does before it"
        )


def _roi(spec: ModelSpec, steps: list[StepResult]) -> BBox | None:
    """Bounding box of the upstream labels a model restricts its search to (the union
    over the steps that produce them)."""
    wanted = spec.input.roi_labels
    if not wanted:
        return None
    found = _sources(steps, wanted)
    _missing(spec, "input.roi_labels", wanted, found)
    by_step: dict[int, tuple[StepResult, list[int]]] = {}
    for step, value in found.values():
        by_step.setdefault(id(step), (step, []))[1].append(value)
    boxes = []
    for step, values in by_step.values():
        box = roi_bbox(step.labels, values, spec.input.roi_margin_mm, step.label_boxes or None)
        if box is not None:
            boxes.append(box)
    if not boxes:
        return _EMPTY_BOX
    return boxes[0] if len(boxes) == 1 else bbox_union(boxes)


def _extra_channels(spec: ModelSpec, steps: list[StepResult]) -> dict[str, np.ndarray] | None:
    wanted = spec.input.extra_channels
    if not wanted:
        return None
    found = _sources(steps, wanted)
    _missing(spec, "input.extra_channels", wanted, found)
    return {name: step.labels.array == value for name, (step, value) in found.items()}


def _context(spec: ModelSpec, steps: list[StepResult]) -> StepResult | None:
    """The region step a finding model's ``within`` rules (and finding order) look at:
    the step producing its ``within`` labels, else the last step with region labels."""
    within = tuple({n for label in spec.finding_labels for n in label.within})
    found = _sources(steps, within)
    if found:
        return next(iter(found.values()))[0]
    regions = [s for s in steps if s.has_regions]
    return regions[-1] if regions else None


@dataclass(frozen=True)
class PendingStep:
    """A model step ready to run: its batch-level task and the session to run it on."""

    bundle: ModelBundle
    session: ModelSession | SessionRef
    task: Task


class VolumeRun:
    """One volume through a pipeline, one model step at a time, as batch-level tasks.

    The scheduler interleaves batches of many runs: it asks :meth:`next_step` for a
    task, feeds its batches to the session (with batches of other studies in between),
    and hands the finished :class:`Prediction` to :meth:`complete_step`, which
    post-processes it and makes the next step's inputs (ROI, upstream masks) available.
    :func:`run_volume` is the same loop for one study on the calling thread.

    ``max_voxels``: the site's ``ingest.max_voxels`` (its ingest policy's); no model's
    grid of the study may be larger, refused (``series_too_large``) when its task is
    made, before the grid is allocated.
    """

    def __init__(
        self,
        ct: Volume,
        pipeline: PipelineSpec,
        *,
        registry: ModelRegistry,
        sessions: SessionPool,
        precision: Precision | None = None,
        channels: ChannelInputs | None = None,
        reused: Sequence[StepResult] = (),
        arrival: ArrivingSlices | None = None,
        array_threads: int | None = None,
        max_voxels: int = DEFAULT_MAX_VOXELS,
    ) -> None:
        self.ct = ct
        self.max_voxels = max_voxels
        # the post-processing's label-by-label work (clean-up, organ measurements) on
        # this many threads: the cores (the network is idle then); 1 is the serial order
        self.array_threads = array_threads or usable_cores()
        # ``ct`` still being decoded: the first step's batches wait for their slices,
        # everything else for the whole volume
        self._arrival = arrival
        self._channels = channels or ChannelInputs()
        self.pipeline = pipeline
        self.precision: str = precision or pipeline.precision
        self._registry = registry
        self._sessions = sessions
        check_pipeline(pipeline, registry)
        # ``reused``: the first steps' results from an earlier run of this study
        # (radserve.pipeline.reuse); only the steps after them run
        for done, step in zip(reused, pipeline.steps, strict=False):
            if (done.bundle.spec.name, done.bundle.spec.version) != (step.model, step.version):
                raise PipelineError(
                    f"a reused result of {done.bundle.key} does not match step "
                    f"{step.step_name} ({step.model} {step.version})"
                )
        if len(reused) >= len(pipeline.steps):
            raise PipelineError("every step reused: nothing would run")
        self._next = len(reused)
        self._step: Step | None = None
        self._pending: PendingStep | None = None
        self.steps: list[StepResult] = list(reused)
        self._timer = StageTimer()

    @property
    def timings(self) -> dict[str, float]:
        """Seconds per stage so far (the step timer's)."""
        return self._timer.seconds

    @property
    def done(self) -> bool:
        return self._next >= len(self.pipeline.steps) and self._pending is None

    def next_step(self) -> PendingStep | None:
        """The next model step's task (None when every step has run)."""
        if self._pending is not None:
            raise PipelineError("complete the pending step before asking for the next one")
        if self._next >= len(self.pipeline.steps):
            return None
        step = self.pipeline.steps[self._next]
        self._step = step
        self._next += 1
        bundle = self._registry.get(step.model, step.version)
        spec = bundle.spec
        t0 = time.perf_counter()
        session = self._sessions.get(bundle, self.precision)
        self.timings[f"{spec.name}: load model"] = time.perf_counter() - t0
        images = self._channels.for_model(spec)
        roi, extra = _roi(spec, self.steps), _extra_channels(spec, self.steps)
        streamed = roi is None and extra is None and images is None and _reads_slices(spec)
        if not streamed:
            self._wait_decoded()
        task = make_task(
            self.ct,
            spec,
            roi,
            extra,
            max_batch_size=session.runtime.batch_cap(spec.input.mode),
            max_voxels=self.max_voxels,
            **({"merge_threads": session.runtime.merge_threads} if _patches(spec) else {}),
            **({"image_channels": images} if images is not None else {}),
            **({"arrival": self._arrival} if self._arrival is not None else {}),
        )
        self._pending = PendingStep(bundle, session, task)
        return self._pending

    def complete_step(self, prediction: Prediction) -> StepResult:
        """Post-process the pending step's prediction; the next step may then start."""
        pending = self._pending
        if pending is None:
            raise PipelineError("no step is pending")
        spec = pending.bundle.spec
        self._wait_decoded()  # post-processing reads the whole volume
        t0 = time.perf_counter()
        if spec.is_classifier:
            result = _classified(pending, self.precision, prediction, self._step)
            for name, seconds in prediction.timings.items():
                if name != "wall":
                    self.timings[f"{spec.name}: {name}"] = seconds
            self._timer.record(f"{spec.name}: postprocess", t0)
            self.steps.append(result)
            self._pending = None
            return result
        release_free_memory()  # what inference's threads freed, before post-processing
        cleaned = clean_label_map(
            prediction.labels.array,
            spec,
            self.ct.voxel_volume_ml,
            in_place=True,
            within=prediction.extent,
            spacing=prediction.labels.spacing,
            threads=self.array_threads,
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
            _context(spec, self.steps),
            cleaned.boxes,
            step=self._step,
            first_finding=1 + sum(len(s.findings) for s in self.steps),
            threads=self.array_threads,
        )
        for name, seconds in prediction.timings.items():
            if name != "wall":
                self.timings[f"{spec.name}: {name}"] = seconds
        self._timer.record(f"{spec.name}: postprocess", t0)
        self.steps.append(result)
        self._pending = None
        return result

    def _wait_decoded(self) -> None:
        if self._arrival is not None:
            self._arrival.wait_all()
            self._arrival = None

    def result(self) -> VolumeResult:
        if not self.done:
            raise PipelineError("the pipeline has steps left to run")
        return VolumeResult(
            steps=list(self.steps), timings=dict(self.timings), paused=dict(self._timer.paused)
        )


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
    channels: ChannelInputs | None = None,
    reused: Sequence[StepResult] = (),
    arrival: ArrivingSlices | None = None,
    array_threads: int | None = None,
    max_voxels: int = DEFAULT_MAX_VOXELS,
) -> VolumeResult:
    """Every model step of ``pipeline`` on one volume; outputs on the volume's grid
    (``channels``: the other series of multi-channel models, on that grid; ``reused``:
    the first steps' results, taken as they are; ``arrival``: ``ct`` is still being
    decoded, see :class:`VolumeRun`; ``array_threads``, ``max_voxels``: see
    :class:`VolumeRun`)."""
    timer = StageTimer(progress)
    run = VolumeRun(
        ct,
        pipeline,
        registry=registry,
        sessions=sessions,
        precision=precision,
        channels=channels,
        reused=reused,
        arrival=arrival,
        array_threads=array_threads,
        max_voxels=max_voxels,
    )
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
    return VolumeResult(
        steps=result.steps,
        timings={**result.timings, **timer.seconds},
        paused={**result.paused, **timer.paused},
    )


def _patches(spec: ModelSpec) -> bool:
    """A 3D segmentation model (a :class:`~radserve.inference.PatchTask`)."""
    return not spec.is_classifier and spec.input.mode == "3d"


def _reads_slices(spec: ModelSpec) -> bool:
    """A slice model (2D/2.5D segmentation): its batches can wait for their slices."""
    return not spec.is_classifier and spec.input.mode in ("2d", "2.5d")


def _step_result(
    bundle: ModelBundle,
    precision: str,
    session: ModelSession | SessionRef,
    prediction: Prediction,
    ct: Volume,
    context: StepResult | None,
    boxes: tuple[BBox | None, ...],
    *,
    step: Step | None = None,
    first_finding: int = 1,
    threads: int = 1,
) -> StepResult:
    """Measurements of one cleaned prediction (``boxes``: of each of its label values).

    The labels' kinds choose the post-processing: region labels are measured, finding
    labels become findings (``within`` and their order from ``context``'s label map),
    numbered from ``first_finding``.
    """
    spec = bundle.spec
    labels = prediction.labels
    provider = session.providers_in_use[0]
    uncovered = bundle.gate_coverage(precision, provider)
    if uncovered:
        logger.warning("%s", uncovered)
    undeclared = undeclared_voxels_warning(spec, labels, boxes)
    if undeclared:
        logger.warning("%s", undeclared)
    result = StepResult(
        bundle,
        precision,
        labels,
        provider,
        organs=organ_measurements(labels, ct, spec, boxes, threads=threads)
        if spec.region_labels
        else [],
        warnings=[*prediction.warnings, *([undeclared] if undeclared else [])],
        label_boxes=boxes,
        gate_warning=uncovered,
        step=step,
    )
    if not spec.finding_labels:
        return result
    lesions = find_lesions(
        prediction,
        ct,
        spec,
        context.labels if context else None,
        _region_names(context.bundle.spec) if context else None,
        boxes=boxes,
    )
    findings, label_map, axes = lesions.findings, lesions.label_map, lesions.axes
    if first_finding > 1:
        findings, label_map, axes = _renumbered(findings, label_map, axes, first_finding - 1)
    return dataclasses.replace(
        result,
        findings=findings,
        finding_labels=label_map,
        finding_axes=axes,
        warnings=[*result.warnings, *lesions.warnings],
    )


def _classified(
    pending: PendingStep, precision: str, prediction: Prediction, step: Step | None
) -> StepResult:
    """A classification step's result: the most probable label, with its probability."""
    spec = pending.bundle.spec
    probabilities = prediction.class_probabilities
    if probabilities is None:
        raise PipelineError(f"classification model {spec.key} returned no class scores")
    # softmax: channel 0 is "none of the labels", channel v label value v; sigmoid: v - 1
    offset = 0 if spec.activation == "softmax" else 1
    by_label = {label.name: probabilities[label.value - offset] for label in spec.labels}
    best = max(spec.labels, key=lambda label: (by_label[label.name], -label.value))
    rules = spec.classifying
    classification = Classification(
        step=step.step_name if step else spec.name,
        label=best.name,
        concept=best.concept,
        label_value=best.value,
        probability=min(1.0, max(0.0, by_label[best.name])),
        positive=by_label[best.name] >= rules.min_probability,
        probabilities={name: round(float(p), 6) for name, p in by_label.items()},
        aggregate=rules.aggregate,
        slices=prediction.slices,
        model=spec.name,
        model_version=spec.version,
        precision=precision,
    )
    provider = pending.session.providers_in_use[0]
    uncovered = pending.bundle.gate_coverage(precision, provider)
    if uncovered:
        logger.warning("%s", uncovered)
    by_value = {c + offset: float(p) for c, p in enumerate(probabilities) if c + offset >= 1}
    undeclared = undeclared_class_warning(spec, by_value)
    if undeclared:
        logger.warning("%s", undeclared)
    return StepResult(
        pending.bundle,
        precision,
        prediction.labels,
        provider,
        warnings=[*prediction.warnings, *([undeclared] if undeclared else [])],
        gate_warning=uncovered,
        step=step,
        classification=classification,
    )


def _renumbered(
    findings: list[Finding], label_map: Volume, axes: list[FindingAxes], offset: int
) -> tuple[list[Finding], Volume, list[FindingAxes]]:
    """Findings (their ids, map values and axes) moved up by ``offset``: the ids of a
    report run 1..n over all its steps."""
    top = offset + len(findings)
    dtype = np.uint8 if top <= np.iinfo(np.uint8).max else np.uint16
    array = label_map.array.astype(dtype)
    array[array > 0] += dtype(offset)
    moved = [
        f.model_copy(
            update={"finding_id": f.finding_id + offset, "label_value": f.label_value + offset}
        )
        for f in findings
    ]
    moved_axes = [a.model_copy(update={"finding_id": a.finding_id + offset}) for a in axes]
    return moved, label_map.with_array(array), moved_axes
