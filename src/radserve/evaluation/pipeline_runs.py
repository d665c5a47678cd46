"""The evaluation's two uses of :mod:`radserve.pipeline`: predicting, and recording inputs.

* :func:`pipeline_predictor` turns ``run_volume`` into the runner's
  ``predict(ct, precision)``. With ``vary`` set, only that model runs at the requested
  precision and the others stay FP32, so one model's variant is judged on its own.
* :func:`record_model_inputs` runs the FP32 pipeline and keeps some of the exact batches
  one model was fed (cropped, resampled, normalised, upstream masks as channels): the
  INT8 calibration set and the speed benchmark's input.
* :func:`agreement_on_studies` runs one model's precisions on studies without ground
  truth and measures each against the FP32 output.

Both work by handing ``run_volume`` a session pool that picks or wraps sessions; the
pipeline itself is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from radserve.domain.accuracy import EvalSummary
from radserve.domain.volume import Volume
from radserve.evaluation.agreement import AgreementCounter, StepOutput, fp32_first
from radserve.evaluation.lesions import SIZE_STRATA
from radserve.evaluation.runner import Predictor, StudyPrediction
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelBundle, ModelRegistry
from radserve.pipeline import SessionPool, run_volume
from radserve.pipeline.channels import ChannelInputs
from radserve.pipeline.spec import PipelineSpec, load_pipeline
from radserve.pipeline.volume import VolumeResult

if TYPE_CHECKING:
    from radserve.inference.providers import RuntimeChoice

__all__ = [
    "agreement_on_studies",
    "organ_label_values",
    "pipeline_predictor",
    "record_model_inputs",
]


def organ_label_values(specs: Sequence[ModelSpec]) -> dict[str, int]:
    """Organ name -> value in the organ map that is scored: the organ step's, i.e. the
    last model with region labels (:attr:`VolumeResult.organ_step`). Only that model's
    labels: merged over every model, two naming one organ with different values would
    score the map by the wrong one."""
    regional = [spec for spec in specs if spec.region_labels]
    if not regional:
        return {}
    return {label.name: label.value for label in regional[-1].labels if label.kind == "organ"}


class _VaryOnePool(SessionPool):
    """Sessions at the requested precision for ``vary`` only; FP32 for other models."""

    def __init__(self, vary: str | None, runtime: RuntimeChoice | None = None) -> None:
        super().__init__(runtime)
        self.vary = vary

    def get(self, bundle: ModelBundle, precision: str):  # type: ignore[no-untyped-def]
        if self.vary is not None and bundle.spec.name != self.vary:
            precision = "fp32"
        return super().get(bundle, precision)


def pipeline_predictor(
    registry: ModelRegistry,
    pipeline: str | PipelineSpec,
    *,
    vary: str | None = None,
    runtime: RuntimeChoice | None = None,
) -> Predictor:
    """``predict(ct, precision) -> StudyPrediction`` through ``run_volume``.

    The organ map is the organ step's label map (values as in the organ model's
    ``model.yaml``), the lesion map the lesion step's finding label map (one value per
    finding). Sessions are created once and reused across studies, on ``runtime``
    (default: the host's choice; a variant gate passes the server's).
    """
    spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
    sessions = _VaryOnePool(vary, runtime)

    def predict(ct: Volume, precision: str) -> StudyPrediction:
        result = run_volume(
            ct,
            spec,
            registry=registry,
            sessions=sessions,
            precision=precision,  # type: ignore[arg-type]
        )
        organ_step, lesion_step = result.organ_step, result.lesion_step
        organs = organ_step.labels.array if organ_step else np.zeros(ct.shape, np.uint8)
        lesions = (
            lesion_step.finding_labels.array
            if lesion_step is not None and lesion_step.finding_labels is not None
            else np.zeros(ct.shape, np.uint16)
        )
        output = None if vary is None else _own_output(result, vary, ct)
        return StudyPrediction(organs, lesions, tuple(result.findings), step=output)

    return predict


def _own_output(result: VolumeResult, model: str, ct: Volume) -> StepOutput | None:
    """What ``model``'s (last) step itself produced: its answer, or its class label map on
    the CT grid; None when no step of the run is that model."""
    steps = [s for s in result.steps if s.bundle.spec.name == model]
    if not steps:
        return None
    if (answer := steps[-1].classification) is not None:
        return StepOutput(answer=(answer.label, answer.positive))
    return StepOutput(labels=steps[-1].labels_on(ct).array)


class _Recording:
    """A session that keeps a uniform sample (reservoir) of the batches it runs."""

    def __init__(self, session: Any, keep: int, rng: np.random.Generator) -> None:
        self._session = session
        self._keep = keep
        self._rng = rng
        self.seen = 0
        self.batches: list[np.ndarray] = []

    def run(self, batch: np.ndarray) -> np.ndarray:
        if len(self.batches) < self._keep:
            self.batches.append(np.array(batch, np.float32))
        else:
            j = int(self._rng.integers(0, self.seen + 1))
            if j < self._keep:
                self.batches[j] = np.array(batch, np.float32)
        self.seen += 1
        return self._session.run(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class _RecordingPool(SessionPool):
    def __init__(self, model: str, keep: int, runtime: RuntimeChoice | None = None) -> None:
        super().__init__(runtime)
        self.model = model
        self.keep = keep
        self.recorders: list[_Recording] = []
        self._rng = np.random.default_rng(0)

    def get(self, bundle: ModelBundle, precision: str):  # type: ignore[no-untyped-def]
        session = super().get(bundle, precision)
        if bundle.spec.name != self.model:
            return session
        recorder = _Recording(session, self.keep, self._rng)
        self.recorders.append(recorder)
        return recorder


def record_model_inputs(
    registry: ModelRegistry,
    pipeline: str | PipelineSpec,
    model: str,
    studies: Iterable[Volume | tuple[Volume, ChannelInputs]],
    *,
    batches_per_study: int = 4,
    runtime: RuntimeChoice | None = None,
) -> list[np.ndarray]:
    """Run the FP32 pipeline on ``studies`` (a volume, or a volume and the other series
    its multi-channel models read), on ``runtime`` (default: the host's choice); return
    up to ``batches_per_study`` input batches per study (a uniform sample) that
    ``model`` was fed."""
    spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
    if model not in {step.model for step in spec.steps}:
        raise ValueError(f"model {model!r} is not a step of pipeline {spec.name!r}")
    sessions = _RecordingPool(model, batches_per_study, runtime)  # one recorder per study
    for study in studies:
        ct, channels = study if isinstance(study, tuple) else (study, None)
        run_volume(
            ct, spec, registry=registry, sessions=sessions, precision="fp32", channels=channels
        )
    return [b for recorder in sessions.recorders for b in recorder.batches]


def agreement_on_studies(
    registry: ModelRegistry,
    pipeline: PipelineSpec,
    model: str,
    studies: Iterable[tuple[Volume, ChannelInputs]],
    *,
    precisions: Sequence[str],
    step_labels: Mapping[int, str],
    runtime: RuntimeChoice | None = None,
) -> dict[str, EvalSummary]:
    """Each precision of ``model`` against its FP32 output on studies without ground
    truth (a site's own: the only way to gate a model on inputs like those it serves).

    The summaries carry no accuracy (no organ Dice, no lesion recall, no false positives
    counted: a note says so), only each variant's ``agreement_vs_fp32``; ``studies`` are
    read one at a time and every precision runs on each before the next is read; the
    sessions run on ``runtime`` (default: the host's choice)."""
    if "fp32" not in precisions:
        raise ValueError("agreement is measured against fp32, which must be among the precisions")
    sessions = _VaryOnePool(model, runtime)
    counters = {p: AgreementCounter(step_labels) for p in precisions if p != "fp32"}
    seconds: dict[str, list[float]] = {p: [] for p in precisions}
    for ct, channels in studies:
        reference: StepOutput | None = None
        for precision in fp32_first(precisions):
            start = time.perf_counter()
            result = run_volume(
                ct,
                pipeline,
                registry=registry,
                sessions=sessions,
                precision=precision,  # type: ignore[arg-type]
                channels=channels,
            )
            seconds[precision].append(time.perf_counter() - start)
            output = _own_output(result, model, ct)
            if output is None:
                raise ValueError(f"model {model!r} is not a step of pipeline {pipeline.name!r}")
            if precision == "fp32":
                reference = output
            else:
                assert reference is not None
                counters[precision].add(reference, output)
    studied = len(seconds["fp32"])
    if not studied:
        raise ValueError("agreement needs at least one study")
    note = (
        f"{studied} studies without ground truth: judged by agreement with fp32 only "
        "(no Dice, recall or false positives scored)"
    )
    return {
        precision: EvalSummary(
            variant=precision,
            n_studies=studied,
            seeds=[],
            dice_mean=None,
            dice={},
            hd95={},
            recall_by_size=dict.fromkeys(SIZE_STRATA),
            recall_by_type={},
            n_lesions_by_size=dict.fromkeys(SIZE_STRATA, 0),
            n_detected_by_size=dict.fromkeys(SIZE_STRATA, 0),
            n_lesions_by_type={},
            fp_per_study=0.0,
            mean_predict_seconds=sum(seconds[precision]) / studied,
            agreement_vs_fp32=counters[precision].result() if precision in counters else None,
            notes=[note],
        )
        for precision in precisions
    }
