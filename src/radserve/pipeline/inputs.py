"""Where a study's volume comes from: the first stage of a run.

A :class:`StudyInput` turns something stored (a DICOM folder or file list, one NIfTI
file) into an :class:`IngestedStudy`: the selected series, loaded, and the series it
passed over. :class:`~radserve.pipeline.work.StudyWork` and
:func:`~radserve.pipeline.study.run_study` take any of them, so a new kind of input is
a new class here, not a subclass of the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from radserve.domain.input_domain import AcquisitionFacts
from radserve.domain.volume import Volume
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
from radserve.ingest.arrival import DecodeAbandonedError
from radserve.ingest.discover import SeveralStudiesError
from radserve.ingest.validate import check_series, check_study_patients
from radserve.pipeline.selection import (
    UNUSABLE,
    PlaneRefusal,
    SlicePlanes,
    no_plane_error,
    passed_over_reason,
    rank_series,
    rejection_reason,
    series_ref,
    stack_rejection_reason,
)
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
        self,
        pipeline: PipelineSpec,
        *,
        policy: IngestPolicy | None,
        timer: StageTimer,
        planes: SlicePlanes | None = None,
    ) -> IngestedStudy:
        """Load the series ``pipeline`` runs on; timings go to ``timer``; ``planes``:
        the planes its slice models read (a series in another is passed over)."""
        ...


def ingest_study(
    sources: Path | Sequence[Path],
    *,
    pipeline: PipelineSpec,
    policy: IngestPolicy | None = None,
    timer: StageTimer | None = None,
    stream: bool = False,
    planes: SlicePlanes | None = None,
) -> IngestedStudy:
    """Discover the series at ``sources``, select one by the pipeline's rules, load it.

    When the preferred series cannot be loaded for what its data holds (a missing
    slice, cut files, an unusable rescale), or its slices lie in another plane than a
    slice model of the pipeline reads (``planes``, judged on its headers: a coronal
    ORIGINAL series for an axial model, beside an axial DERIVED reformat), the next
    qualifying series is tried, and the report says why the preferred one was skipped;
    when none can be used, the preferred series' error is raised (``orientation_unsupported``
    when it was its plane). A limit (``series_too_large``, ``input_too_large``) stops
    the study at once: it is no fault of that series alone, and loading the next one
    would spend the same resources again.

    ``stream``: return while a JPEG 2000 stack is still being decoded, the slices the
    body box is found on first (``loaded.arrival``; see
    :func:`radserve.ingest.load_series`'s ``decode_first``)."""
    timer = timer or StageTimer()
    policy = policy or IngestPolicy()
    rules = pipeline.series_selection
    with timer.stage("ingest: discover"):
        headers = discover_series(sources, policy=policy)  # bounded by the policy's limits
    try:
        ordered, rejected = rank_series(headers, rules)
    except StudyError:
        _refuse_unusable_instance(headers, rules)
        raise
    study = ordered[0].study_instance_uid
    check_study_patients([h for h in headers if h.study_instance_uid == study])
    failed: list[tuple[SeriesHeader, StudyError, PlaneRefusal | None]] = []
    with timer.stage("ingest: load"):
        for candidate in ordered:
            plane = planes.refusal(candidate.frames, policy) if planes is not None else None
            if plane is not None:  # the models cannot read it: not loaded at all
                failed.append((candidate, plane.error(), plane))
                continue
            try:
                loaded = load_series(
                    candidate,
                    policy=policy,
                    required_modality=candidate.modality,
                    decode_first=body_sample_slices if stream else None,
                )
            except StudyError as exc:
                if not _may_try_another(exc):
                    raise
                failed.append((candidate, exc, None))
                release_free_memory()
                continue
            short = _too_few_left(loaded, rules)
            if short is not None:  # the slices were counted before duplicates were dropped
                failed.append((candidate, short, None))
                release_free_memory()
                continue
            break
        else:
            first = failed[0][2]
            if first is not None and all(plane is not None for _, _, plane in failed):
                assert planes is not None
                raise no_plane_error(headers, rules, planes, first, policy)
            raise failed[0][1]
    release_free_memory()  # the decoders' per-frame buffers
    selected = loaded.header
    rejected += [series_ref(header, _skipped_reason(exc, plane)) for header, exc, plane in failed]
    rejected += [
        series_ref(other, passed_over_reason(selected, other, rules))
        for other in ordered[len(failed) + 1 :]
    ]
    if failed:
        loaded = replace(
            loaded, warnings=(*_fallback_warnings(failed, selected, rules), *loaded.warnings)
        )
    return IngestedStudy(loaded, rejected, tuple(headers))


def selection_refusal(
    headers: Sequence[SeriesHeader],
    rules: SeriesRules,
    *,
    planes: SlicePlanes | None = None,
    policy: IngestPolicy | None = None,
) -> StudyError | None:
    """What :func:`ingest_study` fails with before it loads any series, judged on the
    discovered ``headers`` alone (no pixel is read), or None when some series would be
    tried: no series meets the selection ``rules`` (``study_invalid``,
    ``unsupported_modality``), or every one that does lies in a plane no slice model
    reads (``orientation_unsupported``,
    :func:`~radserve.pipeline.selection.no_plane_error`). The same error, in the same
    words, as the job would fail with: the upload form answers it before a job exists
    (:mod:`radserve.service.selection_door`). What is not about selection is not
    judged here (None; the job says it as before): an unusable instance that is why
    no series qualifies (the job fails with its own code, naming its file), series of
    several studies that qualify (``several_studies``), series naming different
    patients."""
    try:
        ordered, _ = rank_series(headers, rules)
    except SeveralStudiesError:
        return None
    except StudyError as exc:
        try:
            _refuse_unusable_instance(headers, rules)
        except StudyError:  # the job fails with that instance's own error: not judged here
            return None
        return exc
    if planes is None:
        return None
    first: PlaneRefusal | None = None
    for candidate in ordered:
        plane = planes.refusal(candidate.frames, policy)
        if plane is None:
            return None
        first = first or plane
    assert first is not None  # rank_series raises rather than return no candidate
    study = ordered[0].study_instance_uid
    try:  # ingest_study checks this first: a job would fail with it, as before
        check_study_patients([h for h in headers if h.study_instance_uid == study])
    except StudyError:
        return None
    return no_plane_error(headers, rules, planes, first, policy)


# codes of a limit reached, not of a series' own data: the study stops, no other series is tried
_LIMIT_CODES = frozenset({"series_too_large", "input_too_large", "archive_rejected"})


def _too_few_left(loaded: LoadedSeries, rules: SeriesRules) -> StudyError | None:
    """The selection rules' slice count on the stack as loaded: a series of 12 instances
    at one position (a repeated acquisition, a sender's duplicate copies) passed the rule
    on its header's count, and ran on the one slice left after the duplicates were
    dropped, with only a warning."""
    slices = loaded.volume.shape[0]
    if slices >= rules.min_slices and slices > 1:
        return None
    reason = stack_rejection_reason(slices, None, rules)
    count = loaded.header.number_of_instances
    return StudyError(
        f"series {loaded.header.series_number}: {_slices(slices)} left of its "
        f"{count} images once the slices at the same position were dropped: {reason}"
    )


def _may_try_another(exc: StudyError) -> bool:
    """Whether a series that failed to load with ``exc`` may give way to the next one."""
    return exc.code not in _LIMIT_CODES and not isinstance(exc, DecodeAbandonedError)


def _skipped_reason(exc: StudyError, plane: PlaneRefusal | None) -> str:
    if plane is not None:
        return f"preferred, but {plane.describe()} ({exc.code})"
    return f"preferred, but could not be loaded ({exc.code})"


def _fallback_warnings(
    failed: Sequence[tuple[SeriesHeader, StudyError, PlaneRefusal | None]],
    used: SeriesHeader,
    rules: SeriesRules,
) -> list[str]:
    """One warning per preferred series skipped: which, why (the error's code and
    message, files named without their folders; or the plane its slices lie in), and
    which series ran instead."""
    return [
        f"series {header.series_number or '?'} ({header.number_of_frames} images), preferred "
        f"({rules.prefer}), "
        + (
            f"was passed over: [{exc.code}] {plane.describe()}"
            if plane is not None
            else f"could not be loaded and was skipped: [{exc.code}] "
            f"{_without_folders(exc.message, header)}"
        )
        + f"; series {used.series_number or '?'} ({used.number_of_frames} images) was "
        "analysed instead"
        for header, exc, plane in failed
    ]


def _without_folders(message: str, header: SeriesHeader) -> str:
    """``message`` with each of the series' files named by its name alone: a folder
    name may say whose study it is, and a report travels further than a log."""
    for source in sorted({f.source for f in header.frames}, key=lambda s: -len(str(s))):
        message = message.replace(str(source), source.name)
    return message


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
        self,
        pipeline: PipelineSpec,
        *,
        policy: IngestPolicy | None,
        timer: StageTimer,
        planes: SlicePlanes | None = None,
    ) -> IngestedStudy:
        return ingest_study(
            self.sources, pipeline=pipeline, policy=policy, timer=timer, planes=planes
        )


@dataclass(frozen=True)
class NiftiInput:
    """One NIfTI volume. NIfTI carries no modality: the pipeline's first accepted
    modality is assumed (values must be in its physical units, HU for CT)."""

    path: Path

    def ingest(
        self,
        pipeline: PipelineSpec,
        *,
        policy: IngestPolicy | None,
        timer: StageTimer,
        planes: SlicePlanes | None = None,
    ) -> IngestedStudy:
        """``planes`` is not used: one volume, nothing to fall back to (a slice model
        that cannot read its plane refuses it, ``orientation_unsupported``)."""
        rules = pipeline.series_selection
        modality = (rules.modalities or ("CT",))[0]
        warnings: list[str] = []
        with timer.stage("ingest: load"):
            volume = load_nifti(
                self.path, policy=policy or IngestPolicy(), modality=modality, warnings=warnings
            )
        _check_nifti_stack(volume, rules)
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
        return IngestedStudy(LoadedSeries(volume, header, tuple(warnings)), [])


def _check_nifti_stack(volume: Volume, rules: SeriesRules) -> None:
    """The series-selection rules on the stack itself (slice count, a single image,
    slice thickness: the NIfTI's slice spacing along k) that a DICOM series meets: a
    1-slice or 2-D NIfTI ran and reported "no findings" where the same DICOM series was
    refused ``study_invalid``. The rules on DICOM attributes (modality, SOP Class, Image
    Type, Series Description, Body Part) have nothing to read in a NIfTI: the upload is
    the one volume asked for, of the pipeline's modality."""
    reason = stack_rejection_reason(volume.shape[0], _plane_distance(volume), rules)
    if reason is not None:
        raise StudyError(
            f"the NIfTI volume ({_slices(volume.shape[0])} along its k axis) does not meet "
            f"the pipeline's selection rules: {reason}"
        )


def _plane_distance(volume: Volume) -> float:
    """The distance between slice planes (along their normal): a sheared affine's slice
    vector is longer (5.39 mm for 5 mm slices sheared 2 mm per slice)."""
    step, rows, columns = volume.affine[:3, :3].T
    normal = np.cross(rows, columns)
    return abs(float(step @ normal)) / float(np.linalg.norm(normal))


def _slices(n: int) -> str:
    return f"{n} slice" if n == 1 else f"{n} slices"


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
    "selection_refusal",
]
