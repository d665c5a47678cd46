"""Where a study's volume comes from: the first stage of a run.

A :class:`StudyInput` turns something stored (a DICOM folder or file list, one NIfTI
file) into an :class:`IngestedStudy`: the selected series, loaded, and the series it
passed over. :class:`~radserve.pipeline.work.StudyWork` and
:func:`~radserve.pipeline.study.run_study` take any of them, so a new kind of input is
a new class here, not a subclass of the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from radserve.domain.input_domain import AcquisitionFacts
from radserve.errors import StudyError
from radserve.ingest import (
    IngestPolicy,
    LoadedSeries,
    PatientInfo,
    SeriesHeader,
    discover_series,
    load_nifti,
    load_series,
)
from radserve.ingest.validate import check_series, check_study_patients
from radserve.pipeline.selection import UNUSABLE, rejection_reason, select_series
from radserve.pipeline.spec import PipelineSpec, SeriesRules
from radserve.pipeline.volume import release_free_memory
from radserve.preprocess.crop import body_sample_slices
from radserve.progress import StageTimer
from radserve.report.schema import SeriesRef

NIFTI_SUFFIXES = (".nii", ".nii.gz")


@dataclass(frozen=True)
class IngestedStudy:
    """The series the pipeline selected, loaded, and the series it passed over."""

    loaded: LoadedSeries
    rejected: list[SeriesRef]
    # every series discovered (multi-channel models take their other series from here)
    series: tuple[SeriesHeader, ...] = ()
    # the acquisition facts, once measured (the input-domain refusal measures them before
    # any model runs; the report reuses them instead of measuring the pixels again)
    facts: AcquisitionFacts | None = None


@runtime_checkable
class StudyInput(Protocol):
    """A stored study the pipeline can read: one method, run on the CPU pool."""

    def ingest(
        self, pipeline: PipelineSpec, *, policy: IngestPolicy | None, timer: StageTimer
    ) -> IngestedStudy:
        """Load the series ``pipeline`` runs on; timings go to ``timer``."""
        ...


def ingest_study(
    sources: Path | Sequence[Path],
    *,
    pipeline: PipelineSpec,
    policy: IngestPolicy | None = None,
    timer: StageTimer | None = None,
    stream: bool = False,
) -> IngestedStudy:
    """Discover the series at ``sources``, select one by the pipeline's rules, load it.

    ``stream``: return while a JPEG 2000 stack is still being decoded, the slices the
    body box is found on first (``loaded.arrival``; see
    :func:`radserve.ingest.load_series`'s ``decode_first``)."""
    timer = timer or StageTimer()
    policy = policy or IngestPolicy()
    with timer.stage("ingest: discover"):
        headers = discover_series(sources, policy=policy)  # bounded by the policy's limits
    try:
        selected, rejected = select_series(headers, pipeline.series_selection)
    except StudyError:
        _refuse_unusable_instance(headers, pipeline.series_selection)
        raise
    study = selected.study_instance_uid
    check_study_patients([h for h in headers if h.study_instance_uid == study])
    with timer.stage("ingest: load"):
        loaded = load_series(
            selected,
            policy=policy,
            required_modality=selected.modality,
            decode_first=body_sample_slices if stream else None,
        )
    release_free_memory()  # the decoders' per-frame buffers
    return IngestedStudy(loaded, rejected, tuple(headers))


def _refuse_unusable_instance(headers: Sequence[SeriesHeader], rules: SeriesRules) -> None:
    """Fail as ingest fails on an unusable instance (its own code: instance_invalid,
    decode_failed, ...) when no series qualified and that instance is why its series was
    refused, or every instance of its series is unusable (a Modality that contradicts the
    SOP Class fails the modality rule first): STOW-RS refuses such an instance with that
    code, so every door answers alike."""
    for header in headers:
        unusable = bool(header.frames) and all(f.problem is not None for f in header.frames)
        if unusable or (rejection_reason(header, rules) or "").startswith(UNUSABLE):
            check_series(header, [])


@dataclass(frozen=True)
class DicomInput:
    """DICOM files: a folder, a zip archive, or a list of files (every series is
    discovered; the pipeline's selection rules pick one)."""

    sources: Path | Sequence[Path]

    def ingest(
        self, pipeline: PipelineSpec, *, policy: IngestPolicy | None, timer: StageTimer
    ) -> IngestedStudy:
        return ingest_study(self.sources, pipeline=pipeline, policy=policy, timer=timer)


@dataclass(frozen=True)
class NiftiInput:
    """One NIfTI volume. NIfTI carries no modality: the pipeline's first accepted
    modality is assumed (values must be in its physical units, HU for CT)."""

    path: Path

    def ingest(
        self, pipeline: PipelineSpec, *, policy: IngestPolicy | None, timer: StageTimer
    ) -> IngestedStudy:
        modality = (pipeline.series_selection.modalities or ("CT",))[0]
        with timer.stage("ingest: load"):
            volume = load_nifti(self.path, policy=policy or IngestPolicy(), modality=modality)
        header = SeriesHeader(
            series_instance_uid="",
            study_instance_uid="",
            modality=modality,
            series_description="NIfTI upload",
            series_number=None,
            body_part_examined="",
            frame_of_reference_uid=None,
            sop_class_uid="",
            image_type=(),
            slice_thickness=None,
            number_of_instances=1,
            patient=PatientInfo(),
            frames=(),
        )
        return IngestedStudy(LoadedSeries(volume, header), [])


def as_input(source: StudyInput | Path | Sequence[Path]) -> StudyInput:
    """``source`` itself when it is a :class:`StudyInput`, else DICOM files at it."""
    if isinstance(source, StudyInput):
        return source
    return DicomInput(source)


def first_file(source: StudyInput | Path | Sequence[Path]) -> Path | None:
    """The path a header-only read (priority attributes) looks at, if any."""
    if isinstance(source, DicomInput):
        source = source.sources
    elif isinstance(source, StudyInput):  # NIfTI and others: no DICOM header to read
        return None
    if isinstance(source, str | Path):
        return Path(source)
    return Path(source[0]) if source else None


__all__ = [
    "NIFTI_SUFFIXES",
    "DicomInput",
    "IngestedStudy",
    "NiftiInput",
    "StudyInput",
    "as_input",
    "first_file",
    "ingest_study",
]
