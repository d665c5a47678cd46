"""A study on disk through a pipeline to a report folder.

ingest (a :class:`~radserve.pipeline.inputs.StudyInput`: discover series, select one by
the pipeline's rules, load the volume) -> :func:`radserve.pipeline.volume.run_volume` ->
report folder: ``report.json``, label maps as NIfTI, key images. The CLI calls
:func:`run_study`; the scheduler runs its three pieces (the input's ``ingest``, a
:class:`~radserve.pipeline.volume.VolumeRun`, :func:`finish_study`) as separate stages
(:class:`~radserve.pipeline.work.StudyWork`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydicom import dcmread
from pydicom.dataset import Dataset

from radserve import durable
from radserve.checkpoints import checkpoint
from radserve.domain import Volume
from radserve.domain.input_domain import AcquisitionFacts
from radserve.errors import StudyError
from radserve.host import usable_cores
from radserve.ingest import IngestPolicy, LoadedSeries, PatientInfo
from radserve.ingest.charset import declare_undeclared_character_set
from radserve.ingest.decode import StackNeedsFloatError
from radserve.ingest.sources import SourceFile
from radserve.ingest.validate import LOSSY_WORDS
from radserve.models.manifest import Precision
from radserve.models.registry import ModelRegistry
from radserve.pipeline.channels import ChannelInputs, load_channels
from radserve.pipeline.checks import check_pipeline
from radserve.pipeline.inputs import (
    DicomInput,
    IngestedStudy,
    StudyInput,
    as_input,
    ingest_study,
)
from radserve.pipeline.profile import (
    acquisition_facts,
    check_input_domain,
    check_output_domain,
    study_features,
)
from radserve.pipeline.selection import SlicePlanes
from radserve.pipeline.spec import PipelineSpec
from radserve.pipeline.volume import SessionPool, StepResult, VolumeResult, run_volume
from radserve.progress import ProgressSink, StageTimer
from radserve.report.json_report import write_report
from radserve.report.keyimages import write_key_images
from radserve.report.nifti import write_label_map
from radserve.report.schema import (
    Geometry,
    LabelMapOutput,
    ModelRun,
    Outputs,
    PipelineInfo,
    Report,
    ReportWarning,
    RuntimeInfo,
    SeriesRef,
    SeriesSelection,
    StudyInfo,
    finding_segments,
    organ_segments,
    utc_now,
)
from radserve.report.shortened import results_character_set, shortened_values
from radserve.report.wording import LOSSY_INPUT

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyResult:
    report: Report
    report_path: Path
    out_dir: Path
    volume_result: VolumeResult
    sources: tuple[SourceFile, ...] = ()
    """The selected series' files or zip members, slice order, each once (for SEG/SR
    references; a NIfTI volume has none)."""
    features: dict[str, Any] | None = None
    """The study's drift features (:func:`radserve.pipeline.profile.study_features`)."""
    patient: PatientInfo | None = None
    """The selected series' patient as ingest read it (never in the report): what the
    FHIR deliveries would otherwise read again from every header of the stored study."""


def run_study(
    sources: StudyInput | Path | Sequence[Path],
    *,
    pipeline: PipelineSpec,
    out_dir: Path,
    registry: ModelRegistry | None = None,
    sessions: SessionPool | None = None,
    precision: Precision | None = None,
    policy: IngestPolicy | None = None,
    cancel: threading.Event | None = None,
    progress: ProgressSink | None = None,
    key_images: bool = True,
    job_id: str | None = None,
    reuse_upstream_of: tuple[Path, str] | None = None,
    stream_decode: bool = True,
    array_threads: int | None = None,
) -> StudyResult:
    """Read the study at ``sources`` (DICOM files, or any :class:`StudyInput`), run
    ``pipeline`` on its selected series, write results.

    ``reuse_upstream_of=(result_dir, step)``: the steps before ``step`` are taken from
    an earlier result of this study (:func:`radserve.pipeline.reuse.upstream_steps`)
    instead of run again; :class:`~radserve.errors.PipelineError` when they cannot be.

    ``stream_decode``: a JPEG 2000 series enters the first model while its later
    slices are still decoding (:func:`_streams`; same labels as a whole decode, since
    the body box is found on the same slices); False decodes it whole first.

    ``array_threads``: threads for the work between the networks and in the report
    (:class:`~radserve.pipeline.volume.VolumeRun`, :func:`finish_study`); default the
    usable cores, 1 the serial order (same labels and report).
    """
    t_start = time.perf_counter()
    registry = registry or ModelRegistry()
    sessions = sessions or SessionPool()
    timer = StageTimer(progress)
    check_pipeline(pipeline, registry)  # before reading the study: a broken YAML fails first
    study_input = as_input(sources)
    stream = stream_decode and _streams(study_input, pipeline, registry, policy, reuse_upstream_of)

    def attempt(timer: StageTimer, stream: bool) -> StudyResult:
        return _run_study(
            study_input,
            pipeline,
            out_dir,
            registry,
            sessions,
            precision,
            policy,
            cancel,
            progress,
            timer,
            t_start,
            key_images=key_images,
            job_id=job_id,
            reuse_upstream_of=reuse_upstream_of,
            stream=stream,
            array_threads=array_threads,
        )

    try:
        return attempt(timer, stream)
    except StackNeedsFloatError:
        if not stream:
            raise
        logger.info("values do not fit int16; decoding the study whole, as float32")
        return attempt(StageTimer(progress), False)


def load_study(
    sources: StudyInput | Path | Sequence[Path],
    pipeline: PipelineSpec,
    registry: ModelRegistry,
    policy: IngestPolicy | None = None,
) -> tuple[Volume, ChannelInputs]:
    """The volume and the other series a run of ``pipeline`` reads from ``sources``,
    read as :func:`run_study` reads them (whole, not streamed): for runs that are not a
    study's job, such as a precision gate on a site's own studies."""
    timer = StageTimer()
    planes = SlicePlanes.of_pipeline(pipeline, registry)
    ingested = as_input(sources).ingest(pipeline, policy=policy, timer=timer, planes=planes)
    ingested, channels = load_channels(ingested, pipeline, registry, policy, timer)
    return ingested.loaded.volume, channels


def _streams(
    study_input: StudyInput,
    pipeline: PipelineSpec,
    registry: ModelRegistry,
    policy: IngestPolicy | None,
    reuse_upstream_of: tuple[Path, str] | None,
) -> bool:
    """Whether decoding may overlap the first model: DICOM files, and nothing before
    that model reads the whole volume (domain refusal, other series, reused steps)."""
    if not isinstance(study_input, DicomInput) or reuse_upstream_of is not None:
        return False
    if policy is not None and policy.input_domain == "refuse":
        return False
    return not any(registry.get(s.model, s.version).spec.input.channels for s in pipeline.steps)


def _run_study(
    study_input: StudyInput,
    pipeline: PipelineSpec,
    out_dir: Path,
    registry: ModelRegistry,
    sessions: SessionPool,
    precision: Precision | None,
    policy: IngestPolicy | None,
    cancel: threading.Event | None,
    progress: ProgressSink | None,
    timer: StageTimer,
    t_start: float,
    *,
    key_images: bool,
    job_id: str | None,
    reuse_upstream_of: tuple[Path, str] | None,
    stream: bool,
    array_threads: int | None,
) -> StudyResult:
    planes = SlicePlanes.of_pipeline(pipeline, registry)  # a series no slice model reads
    if stream:
        assert isinstance(study_input, DicomInput)
        ingested = ingest_study(
            study_input.sources,
            pipeline=pipeline,
            policy=policy,
            timer=timer,
            stream=True,
            planes=planes,
        )
    else:
        ingested = study_input.ingest(pipeline, policy=policy, timer=timer, planes=planes)
    # a stack still decoding: a cancel stops its decoder at once, and so does any end of
    # this run before the stack is in place (a failure, an interrupt): no decoder
    # process is kept busy for a result nobody will read
    arrival = ingested.loaded.arrival
    if arrival is not None:
        arrival.watch(cancel)
    try:
        return _run_ingested(
            ingested, pipeline, out_dir, registry, sessions, precision, policy, cancel,
            progress, timer, t_start, key_images=key_images, job_id=job_id,
            reuse_upstream_of=reuse_upstream_of, array_threads=array_threads,
        )  # fmt: skip
    except BaseException as exc:
        if arrival is not None:
            arrival.abandon(exc)
        raise


def _run_ingested(
    ingested: IngestedStudy,
    pipeline: PipelineSpec,
    out_dir: Path,
    registry: ModelRegistry,
    sessions: SessionPool,
    precision: Precision | None,
    policy: IngestPolicy | None,
    cancel: threading.Event | None,
    progress: ProgressSink | None,
    timer: StageTimer,
    t_start: float,
    *,
    key_images: bool,
    job_id: str | None,
    reuse_upstream_of: tuple[Path, str] | None,
    array_threads: int | None,
) -> StudyResult:
    ingested = refuse_outside_domain(ingested, pipeline, registry, policy)
    ingested, channels = load_channels(ingested, pipeline, registry, policy, timer)
    reused: list[StepResult] = []
    if reuse_upstream_of is not None:
        from radserve.pipeline.reuse import upstream_steps

        result_dir, step = reuse_upstream_of
        reused = upstream_steps(result_dir, pipeline, registry, ingested.loaded.volume, step)
    result = run_volume(
        ingested.loaded.volume,
        pipeline,
        registry=registry,
        sessions=sessions,
        precision=precision,
        cancel=cancel,
        progress=progress,
        channels=channels,
        reused=reused,
        arrival=ingested.loaded.arrival,
        array_threads=array_threads,
        max_voxels=(policy or IngestPolicy()).max_voxels,
    )
    return finish_study(
        ingested,
        result,
        pipeline=pipeline,
        sessions=sessions,
        out_dir=out_dir,
        timer=timer,
        started=t_start,
        key_images=key_images,
        job_id=job_id,
        array_threads=array_threads,
    )


def finish_study(
    ingested: IngestedStudy,
    result: VolumeResult,
    *,
    pipeline: PipelineSpec,
    sessions: SessionPool,
    out_dir: Path,
    timer: StageTimer | None = None,
    started: float | None = None,
    key_images: bool = True,
    job_id: str | None = None,
    array_threads: int | None = None,
) -> StudyResult:
    """Write the report folder (label maps, key images, ``report.json``) for ``result``.

    The last third of :func:`run_study`. ``started`` (a ``time.perf_counter()`` reading)
    gives the report's ``total`` timing. The drift features are computed beside the
    files (on a thread of their own) unless ``array_threads`` is 1.
    """
    timer = timer or StageTimer()
    timer.update(result.timings, result.paused)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the label maps and report.json: each whole or absent, their folder fsynced once
    with durable.batch(), ThreadPoolExecutor(1, thread_name_prefix="drift-features") as side:
        beside = (array_threads or usable_cores()) > 1
        # The facts (the fat peak is measured from the pixels) feed both the report's
        # domain check and the drift features: measured once (at ingest when the domain
        # may refuse the study), beside the files unless the study has one thread for
        # array work.
        facts_job = _facts_job(side, ingested) if beside else None
        features_job = (
            side.submit(copy_context().run, _features_after, ingested, facts_job, result)
            if facts_job is not None
            else None
        )
        with timer.stage("report"):
            outputs = _write_outputs(out_dir, ingested.loaded.volume, result, key_images=key_images)
        if started is not None:
            timer.seconds["total"] = time.perf_counter() - started
        facts = facts_job.result() if facts_job else _measured_facts(ingested)
        report = _build_report(
            ingested.loaded,
            facts,
            pipeline,
            result,
            sessions,
            ingested.rejected,
            outputs,
            timer,
            job_id,
        )
        features = features_job.result() if features_job else _features(ingested, facts, result)
        report_path = write_report(report, out_dir / "report.json")
    logger.info(
        "study done: %d findings, %d organs, %.1f s",
        len(report.findings),
        len(report.organ_measurements),
        timer.seconds.get("total", 0.0),
    )
    return StudyResult(
        report,
        report_path,
        out_dir,
        result,
        _sources(ingested.loaded),
        features,
        ingested.loaded.header.patient,
    )


def refuse_outside_domain(
    ingested: IngestedStudy,
    pipeline: PipelineSpec,
    registry: ModelRegistry,
    policy: IngestPolicy | None,
) -> IngestedStudy:
    """Fail the study before any model runs when it lies outside a model's declared input
    domain and the policy says ``input_domain: refuse`` (``flag`` warns in the report).
    Returns the study with the facts it measured for that, for the report."""
    if policy is None or policy.input_domain != "refuse":
        return ingested
    specs = [registry.get(step.model, step.version).spec for step in pipeline.steps]
    facts = _measured_facts(ingested)
    check_input_domain(facts, specs, refuse=True)
    return dataclasses.replace(ingested, facts=facts)


def _measured_facts(ingested: IngestedStudy) -> AcquisitionFacts:
    return ingested.facts or acquisition_facts(ingested.loaded)


def _facts_job(side: ThreadPoolExecutor, ingested: IngestedStudy) -> Future[AcquisitionFacts]:
    """The study's facts as a job of ``side``, or as a job done when they are known."""
    if ingested.facts is None:
        return side.submit(copy_context().run, acquisition_facts, ingested.loaded)
    known: Future[AcquisitionFacts] = Future()
    known.set_result(ingested.facts)
    return known


def _features(
    ingested: IngestedStudy, facts: AcquisitionFacts, result: VolumeResult
) -> dict[str, Any] | None:
    """Drift features; a failure here never fails the study (it only goes unmonitored)."""
    try:
        return study_features(ingested.loaded, facts, result)
    except Exception:
        logger.exception("drift features of the study could not be computed")
        return None


def _features_after(
    ingested: IngestedStudy, facts_job: Future[AcquisitionFacts], result: VolumeResult
) -> dict[str, Any] | None:
    """:func:`_features` once the facts are measured (queued behind them on one thread)."""
    return _features(ingested, facts_job.result(), result)


def _first_source_header(loaded: LoadedSeries) -> Dataset | None:
    """The header the DICOM results copy patient and study attributes from (None when
    they have no DICOM file to copy from, or it cannot be read: they are not written)."""
    files = _source_files(loaded)
    if not files:
        return None
    try:
        return declare_undeclared_character_set(dcmread(files[0], stop_before_pixels=True))
    except Exception:  # pydicom raises many types on damaged input
        return None


def _sources(loaded: LoadedSeries) -> tuple[SourceFile, ...]:
    """The series' files or zip members, slice order, each once (a multi-frame file
    holds many slices)."""
    return tuple(dict.fromkeys(s.source for s in loaded.source_slices))


def _source_files(loaded: LoadedSeries) -> tuple[Path, ...]:
    """:func:`_sources` as files on disk; none when they are zip members."""
    sources = _sources(loaded)
    if any(s.member is not None for s in sources):
        return ()
    return tuple(s.path for s in sources)


def _write_outputs(out_dir: Path, ct: Volume, result: VolumeResult, *, key_images: bool) -> Outputs:
    """One label map per step and the key images. The label maps are gzip-compressed on
    worker threads (zlib lets go of the GIL) while the key images render here: on two
    cores the report stage takes the time of its longest part rather than of all of them.
    Each runs in a copy of this thread's context, so it joins the caller's
    :func:`radserve.durable.batch` (one folder fsync) rather than syncing the folder alone.

    A step's map is ``<output>.nii.gz`` (its region labels, or its numbered findings); a
    step with both writes its findings to ``<output>-findings.nii.gz``.
    """
    label_maps: list[LabelMapOutput] = []
    writes: list[Future[None]] = []
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="label-map") as pool:
        for step in result.steps:
            checkpoint()  # a routine study's report lets URGENT work pass, map by map
            spec = step.bundle.spec
            if step.has_regions:
                path = f"{step.output}.nii.gz"
                labels = step.labels_on(ct)
                writes.append(
                    pool.submit(copy_context().run, write_label_map, labels, out_dir / path)
                )
                kinds = {label.kind for label in spec.region_labels}
                label_maps.append(
                    LabelMapOutput(
                        path=path,
                        kind="organs" if kinds == {"organ"} else "structures",
                        segments=organ_segments(spec),
                        step=step.name,
                    )
                )
            if step.finding_labels is not None:
                stem = f"{step.output}-findings" if step.has_regions else step.output
                path = f"{stem}.nii.gz"
                writes.append(
                    pool.submit(
                        copy_context().run, write_label_map, step.finding_labels, out_dir / path
                    )
                )
                label_maps.append(
                    LabelMapOutput(
                        path=path,
                        kind="findings",
                        segments=finding_segments(step.findings, spec),
                        step=step.name,
                    )
                )
        images = []
        finding_steps = [s for s in result.steps if s.finding_labels is not None]
        if key_images and finding_steps:
            organ_step = result.organ_step
            organ_spec = organ_step.bundle.spec if organ_step else None
            images = write_key_images(
                out_dir,
                ct,
                result.findings,
                _merged_findings(finding_steps),
                axes=result.finding_axes,
                organ_labels=organ_step.labels_on(ct) if organ_step else None,
                organ_colors={lb.value: lb.color for lb in organ_spec.labels}
                if organ_spec
                else None,
                label_colors={
                    lb.name: lb.color for s in finding_steps for lb in s.bundle.spec.labels
                },
                modality=finding_steps[0].bundle.spec.modality,
                organ_sites={lb.name: lb.concept for lb in organ_spec.labels}
                if organ_spec
                else None,
            )
        for write in writes:
            write.result()  # a failed write fails the report, as before
    return Outputs(label_maps=label_maps, key_images=images)


def _merged_findings(steps: list[StepResult]) -> Volume:
    """One map of every step's findings (their values are distinct: ids run across
    steps); the first step's map itself when there is one."""
    first = steps[0].finding_labels
    assert first is not None
    if len(steps) == 1:
        return first
    arrays = [s.finding_labels.array for s in steps if s.finding_labels is not None]
    dtype = np.result_type(*arrays)
    merged = np.zeros(first.shape, dtype=dtype)
    for array in arrays:
        np.maximum(merged, array, out=merged)
    return first.with_array(merged)


def _build_report(
    loaded: LoadedSeries,
    facts: AcquisitionFacts,
    pipeline: PipelineSpec,
    result: VolumeResult,
    sessions: SessionPool,
    rejected: list[SeriesRef],
    outputs: Outputs,
    timer: StageTimer,
    job_id: str | None,
) -> Report:
    header = loaded.header
    runtime = sessions.runtime
    models = [
        ModelRun(
            name=s.bundle.spec.name,
            version=s.bundle.spec.version,
            precision=s.precision,
            onnx_sha256=s.bundle.sha256(s.precision),
            execution_provider=s.execution_provider,
        )
        for s in result.steps
    ]
    warnings = [
        ReportWarning(code=LOSSY_INPUT if LOSSY_WORDS in w else "ingest", message=w, stage="ingest")
        for w in loaded.warnings
    ]
    warnings += [
        ReportWarning(code="variant_not_gated_here", message=w, stage="inference")
        for w in result.gate_warnings
    ]
    warnings += [
        ReportWarning(code="postprocess", message=w, stage="postprocess") for w in result.warnings
    ]
    warnings += [
        ReportWarning(code=code, message=message, stage="ingest")
        for code, message in check_input_domain(
            facts, [s.bundle.spec for s in result.steps], refuse=False
        )
    ]
    warnings += [
        ReportWarning(code=code, message=message, stage="postprocess")
        for code, message in check_output_domain(result)
    ]
    report = Report(
        generated_at=utc_now(),
        job_id=job_id,
        study=StudyInfo(
            study_instance_uid=header.study_instance_uid,
            series_instance_uid=header.series_instance_uid,
            accession_number=header.patient.accession_number or None,
            modality=header.modality,
            study_date=_dicom_date(header.patient.study_date),
        ),
        pipeline=PipelineInfo(name=pipeline.name, version=pipeline.version),
        models=models,
        runtime=RuntimeInfo(
            providers=list(runtime.providers),
            threads=runtime.intra_op_threads,
            device=runtime.device,
        ),
        series_selection=SeriesSelection(
            selected=SeriesRef(
                series_instance_uid=header.series_instance_uid,
                series_number=header.series_number,
                modality=header.modality,
                instance_count=header.number_of_instances,
            ),
            rejected=rejected,
        ),
        geometry=Geometry.from_volume(
            loaded.volume, [s.frame_number for s in loaded.source_slices]
        ),
        findings=result.findings,
        finding_axes=result.finding_axes,
        organ_measurements=result.organ_measurements,
        classifications=result.classifications,
        timings={k: round(v, 4) for k, v in timer.seconds.items()},
        paused={k: round(v, 4) for k, v in timer.paused.items()},
        warnings=warnings,
        outputs=outputs,
    )
    # counted in the character set the results are written in, which the report decides
    source = _first_source_header(loaded)
    written_in = None if source is None else results_character_set(source, report)
    shortened = [
        ReportWarning(code=code, message=message, stage="report")
        for code, message in shortened_values(source, written_in)
    ]
    return report.model_copy(update={"warnings": [*warnings, *shortened]}) if shortened else report


def _dicom_date(value: str) -> dt.date | None:
    try:
        return dt.datetime.strptime(value.strip(), "%Y%m%d").date() if value else None
    except ValueError:
        return None


__all__ = [
    "StudyError",
    "StudyResult",
    "finish_study",
    "load_study",
    "run_study",
]
