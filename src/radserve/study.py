"""A study on disk through a pipeline to a report folder.

ingest (discover series, select one by the pipeline's rules, load the volume) ->
:func:`radserve.pipeline.run_volume` -> report folder: ``report.json``, label maps as
NIfTI, key images. The CLI calls :func:`run_study`; the scheduler calls its three pieces
(:func:`ingest_study`, a :class:`~radserve.pipeline.VolumeRun`, :func:`finish_study`)
as separate stages.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from radserve.domain import Volume
from radserve.errors import StudyError
from radserve.ingest import IngestPolicy, LoadedSeries, discover_series, load_series
from radserve.models.manifest import Precision
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, VolumeResult, release_free_memory, run_volume
from radserve.pipelines.selection import select_series
from radserve.pipelines.spec import PipelineSpec
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

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyResult:
    report: Report
    report_path: Path
    out_dir: Path
    volume_result: VolumeResult
    source_files: tuple[Path, ...] = ()
    """The selected series' files, slice order (for SEG/SR references); empty when the
    series came from a zip archive or the slices were resampled on ingest."""


def run_study(
    sources: Path | Sequence[Path],
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
) -> StudyResult:
    """Read the study at ``sources``, run ``pipeline`` on its selected series, write results."""
    t_start = time.perf_counter()
    registry = registry or ModelRegistry()
    sessions = sessions or SessionPool()
    timer = StageTimer(progress)
    ingested = ingest_study(sources, pipeline=pipeline, policy=policy, timer=timer)
    result = run_volume(
        ingested.loaded.volume,
        pipeline,
        registry=registry,
        sessions=sessions,
        precision=precision,
        cancel=cancel,
        progress=progress,
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
    )


@dataclass(frozen=True)
class IngestedStudy:
    """The series the pipeline selected, loaded, and the series it passed over."""

    loaded: LoadedSeries
    rejected: list[SeriesRef]


def ingest_study(
    sources: Path | Sequence[Path],
    *,
    pipeline: PipelineSpec,
    policy: IngestPolicy | None = None,
    timer: StageTimer | None = None,
) -> IngestedStudy:
    """Discover the series at ``sources``, select one by the pipeline's rules, load it.

    The first third of :func:`run_study`; the scheduler runs it on its CPU pool.
    """
    timer = timer or StageTimer()
    with timer.stage("ingest: discover"):
        headers = discover_series(sources)
    selected, rejected = select_series(headers, pipeline.series_selection)
    with timer.stage("ingest: load"):
        loaded = load_series(
            selected,
            policy=policy or IngestPolicy(),
            required_modality=selected.modality,
        )
    release_free_memory()  # the decoders' per-frame buffers
    return IngestedStudy(loaded, rejected)


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
) -> StudyResult:
    """Write the report folder (label maps, key images, ``report.json``) for ``result``.

    The last third of :func:`run_study`. ``started`` (a ``time.perf_counter()`` reading)
    gives the report's ``total`` timing.
    """
    timer = timer or StageTimer()
    timer.seconds.update(result.timings)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with timer.stage("report"):
        outputs = _write_outputs(out_dir, ingested.loaded.volume, result, key_images=key_images)
    if started is not None:
        timer.seconds["total"] = time.perf_counter() - started
    report = _build_report(
        ingested.loaded,
        pipeline,
        result,
        sessions,
        ingested.rejected,
        outputs,
        timer.seconds,
        job_id,
    )
    report_path = write_report(report, out_dir / "report.json")
    logger.info(
        "study done: %d findings, %d organs, %.1f s",
        len(report.findings),
        len(report.organ_measurements),
        timer.seconds.get("total", 0.0),
    )
    return StudyResult(report, report_path, out_dir, result, _source_files(ingested.loaded))


def _source_files(loaded: LoadedSeries) -> tuple[Path, ...]:
    sources = [s.source for s in loaded.source_slices]
    if not sources or any(s.member is not None for s in sources):
        return ()
    return tuple(dict.fromkeys(s.path for s in sources))


def _write_outputs(out_dir: Path, ct: Volume, result: VolumeResult, *, key_images: bool) -> Outputs:
    """Label maps and key images. The label maps are gzip-compressed on worker threads
    (zlib lets go of the GIL) while the key images render here: on two cores the
    report stage takes the time of its longest part rather than of all of them."""
    label_maps: list[LabelMapOutput] = []
    writes: list[Future[None]] = []
    organ_step = result.organ_step
    lesion_step = result.lesion_step
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="label-map") as pool:
        if organ_step is not None:
            organs_path = out_dir / "organs.nii.gz"
            writes.append(pool.submit(write_label_map, organ_step.labels, organs_path))
            label_maps.append(
                LabelMapOutput(
                    path="organs.nii.gz",
                    kind="organs",
                    segments=organ_segments(organ_step.bundle.spec),
                )
            )
        if lesion_step is not None and lesion_step.finding_labels is not None:
            writes.append(
                pool.submit(
                    write_label_map, lesion_step.finding_labels, out_dir / "findings.nii.gz"
                )
            )
            label_maps.append(
                LabelMapOutput(
                    path="findings.nii.gz",
                    kind="findings",
                    segments=finding_segments(lesion_step.findings, lesion_step.bundle.spec),
                )
            )
        images = []
        if key_images and lesion_step is not None and lesion_step.finding_labels is not None:
            spec = lesion_step.bundle.spec
            organ_spec = organ_step.bundle.spec if organ_step else None
            images = write_key_images(
                out_dir,
                ct,
                lesion_step.findings,
                lesion_step.finding_labels,
                axes=lesion_step.finding_axes,
                organ_labels=organ_step.labels if organ_step else None,
                organ_colors={lb.value: lb.color for lb in organ_spec.labels}
                if organ_spec
                else None,
                label_colors={lb.name: lb.color for lb in spec.labels},
                modality=spec.modality,
            )
        for write in writes:
            write.result()  # a failed write fails the report, as before
    return Outputs(label_maps=label_maps, key_images=images)


def _build_report(
    loaded: LoadedSeries,
    pipeline: PipelineSpec,
    result: VolumeResult,
    sessions: SessionPool,
    rejected: list[SeriesRef],
    outputs: Outputs,
    timings: dict[str, float],
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
    warnings = [ReportWarning(code="ingest", message=w, stage="ingest") for w in loaded.warnings]
    warnings += [
        ReportWarning(code="variant_not_gated_here", message=w, stage="inference")
        for w in result.gate_warnings
    ]
    warnings += [
        ReportWarning(code="postprocess", message=w, stage="postprocess") for w in result.warnings
    ]
    return Report(
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
            ),
            rejected=rejected,
        ),
        geometry=Geometry.from_volume(loaded.volume),
        findings=result.findings,
        finding_axes=result.lesion_step.finding_axes if result.lesion_step else [],
        organ_measurements=result.organ_measurements,
        timings={k: round(v, 4) for k, v in timings.items()},
        warnings=warnings,
        outputs=outputs,
    )


def _dicom_date(value: str) -> dt.date | None:
    try:
        return dt.datetime.strptime(value.strip(), "%Y%m%d").date() if value else None
    except ValueError:
        return None


__all__ = [
    "IngestedStudy",
    "StudyError",
    "StudyResult",
    "finish_study",
    "ingest_study",
    "run_study",
]
