"""Run one study through one pipeline: files in, measured findings and a report out.

Synchronous and free of web/network code: the CLI, the benchmark, the evaluation and
(later) the scheduler's workers all call :func:`run_study` or :func:`run_volume`.
The stages follow the data flow: ingest -> (per model step) preprocess + inference
-> postprocess -> report files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from radserve.domain import Finding, OrganMeasurement, Prediction, Volume
from radserve.errors import PipelineError
from radserve.inference import (
    ModelSession,
    RuntimeChoice,
    choose_runtime,
    make_task,
    run_task,
    run_task_overlapped,
)
from radserve.models.manifest import ModelSpec, Precision
from radserve.models.registry import ModelBundle, ModelRegistry
from radserve.pipelines.spec import PipelineSpec
from radserve.postprocess.components import clean_labels
from radserve.postprocess.diameters import FindingAxes
from radserve.postprocess.findings import find_lesions, organ_measurements
from radserve.preprocess.crop import BBox, bbox_of_mask, expand_bbox
from radserve.progress import ProgressSink, StageTimer

logger = logging.getLogger(__name__)


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
    """What one model step produced, on the input volume's grid."""

    bundle: ModelBundle
    precision: str
    labels: Volume
    execution_provider: str
    organs: list[OrganMeasurement] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    finding_labels: Volume | None = None
    finding_axes: list[FindingAxes] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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
    box = bbox_of_mask(np.isin(organs.labels.array, values))
    if box is None:
        return (slice(0, 0), slice(0, 0), slice(0, 0))
    margin = tuple(int(np.ceil(spec.input.roi_margin_mm / s)) for s in volume.spacing)
    return expand_bbox(box, margin, volume.shape)  # type: ignore[arg-type]


def _extra_channels(spec: ModelSpec, organs: StepResult | None) -> dict[str, np.ndarray] | None:
    if not spec.input.extra_channels:
        return None
    if organs is None:
        raise PipelineError(f"model {spec.key} needs upstream masks; no organ step ran")
    by_name = {n: v for v, n in _organ_names(organs.bundle.spec).items()}
    return {name: organs.labels.array == by_name[name] for name in spec.input.extra_channels}


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
    steps: list[StepResult] = []
    organs: StepResult | None = None
    chosen = precision or pipeline.precision
    for step in pipeline.steps:
        bundle = registry.get(step.model, step.version)
        spec = bundle.spec
        with timer.stage(f"{spec.name}: load model"):
            session = sessions.get(bundle, chosen)
        task = make_task(ct, spec, _roi(spec, organs, ct), _extra_channels(spec, organs))
        stage = f"{spec.name}: inference"
        with timer.stage(stage, total=task.total_batches):
            runner = run_task_overlapped if overlapped else run_task
            prediction = runner(
                task,
                session,
                cancel=cancel,
                progress=lambda done, total, s=stage: timer.progress.advance(s),
            )
        with timer.stage(f"{spec.name}: postprocess"):
            labels = prediction.labels.with_array(
                clean_labels(prediction.labels.array, spec, ct.voxel_volume_ml)
            )
            prediction = dataclasses.replace(prediction, labels=labels)
            result = _step_result(bundle, chosen, session, prediction, ct, organs)
        for name, seconds in prediction.timings.items():
            timer.seconds[f"{spec.name}: {name}"] = seconds
        steps.append(result)
        if result.organs:
            organs = result
    return VolumeResult(steps=steps, timings=timer.seconds)


def _step_result(
    bundle: ModelBundle,
    precision: str,
    session: ModelSession,
    prediction: Prediction,
    ct: Volume,
    organs: StepResult | None,
) -> StepResult:
    spec = bundle.spec
    kinds = {label.kind for label in spec.labels}
    labels = prediction.labels
    organ_list = organ_measurements(labels, ct, spec) if "organ" in kinds else []
    if "lesion" not in kinds:
        return StepResult(bundle, precision, labels, session.providers_in_use[0], organs=organ_list)
    lesions = find_lesions(
        prediction,
        ct,
        spec,
        organs.labels if organs else None,
        _organ_names(organs.bundle.spec) if organs else None,
    )
    return StepResult(
        bundle,
        precision,
        labels,
        session.providers_in_use[0],
        organs=organ_list,
        findings=lesions.findings,
        finding_labels=lesions.label_map,
        finding_axes=lesions.axes,
        warnings=list(lesions.warnings),
    )


def fingerprint_files(paths: Sequence[Path]) -> str:
    """SHA-256 over the sorted SHA-256 of each input file: the study's content identity."""
    digests = sorted(hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths)
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()
