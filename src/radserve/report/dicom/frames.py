"""Which source image each volume slice is, as DICOM SEG and SR reference it.

A volume comes either from single-frame instances (CT/MR Image Storage: one instance a
slice) or from the frames of one Enhanced multi-frame instance (Enhanced CT/MR, Legacy
Converted Enhanced: one instance, a frame a slice). The SEG then has the one instance as
its source image and names each frame in its Derivation Image Sequence; the SR names the
frame (Referenced Frame Number) wherever it references an image. highdicom 0.28 builds a
SEG from exactly one multi-frame source whose Plane Orientation and Pixel Measures are
shared by all frames, so what cannot be expressed that way is refused here with the
reason, before inference where the run path can tell (:func:`check_loaded_references`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import highdicom as hd
import numpy as np
import pydicom
from pydicom.dataset import Dataset

from radserve.errors import ReportError, StudyError

if TYPE_CHECKING:
    from radserve.ingest import LoadedSeries

_SEND_AS = (
    "send the series as one Enhanced instance or as single-frame images (CT/MR Image "
    "Storage, the scanner's classic export)"
)


class SourceFramesError(StudyError):
    """A series whose results DICOM SEG/SR cannot reference the way it is made (instances
    mixing Enhanced and single-frame images, an Enhanced instance whose frames differ in
    geometry, slices resampled on ingest because the study has gaps): the study's shape
    under the site's settings, refused whatever model version would run it (was
    ``report_failed``, which reads as radserve's own failure and counted against a
    canary)."""

    code = "source_frames_unsupported"


# the functional groups highdicom reads from the shared item only: (sequence, keyword, what)
_SHARED_GEOMETRY = (
    ("PlaneOrientationSequence", "ImageOrientationPatient", "orientation"),
    ("PixelMeasuresSequence", "PixelSpacing", "pixel spacing"),
)
# per orientation cosine / mm of pixel spacing: what ingest still takes as one stack
# (radserve.ingest.discover splits a series beyond it)
_TOLERANCE = 1e-3


@dataclass(frozen=True)
class SliceSources:
    """The source header of every volume slice, in slice order, and when the slices are
    frames of one Enhanced instance, each slice's 1-based frame number in it."""

    headers: tuple[Dataset, ...]
    frame_numbers: tuple[int, ...] = ()  # empty: single-frame instances

    def __len__(self) -> int:
        return len(self.headers)

    def __getitem__(self, index: int) -> Dataset:
        return self.headers[index]

    def frames_of(self, index: int) -> list[int] | None:
        """Referenced Frame Number(s) of slice ``index``; None for a single-frame instance."""
        return [self.frame_numbers[index]] if self.frame_numbers else None

    def instances(self) -> list[Dataset]:
        """Each source instance once (an Enhanced series is one instance for every slice)."""
        return list({str(ds.SOPInstanceUID): ds for ds in self.headers}.values())


def check_slice_references(uids: Sequence[str], frame_numbers: Sequence[int | None] = ()) -> None:
    """Refuse slices that DICOM SEG/SR cannot reference: they must be single-frame
    instances, one each, or frames of one Enhanced instance, one each.

    Called again before inference for studies whose results go back as DICOM (see
    :class:`radserve.pipeline.work.StudyWork`), so such a series is refused in seconds
    instead of after the whole pipeline has run for nothing.
    """
    if not uids:  # the study's gaps as the site's ingest settings shape them
        raise SourceFramesError(
            "the volume has no source SOP Instance UIDs per slice (the series was resampled "
            "on ingest), so DICOM SEG/SR cannot reference source frames; turn resampling off"
        )
    if frame_numbers and len(frame_numbers) != len(uids):
        raise ReportError(
            f"the report names {len(frame_numbers)} source frame numbers for {len(uids)} "
            "slices; re-run the job"
        )
    framed = {u for u, n in zip(uids, frame_numbers, strict=False) if n is not None}
    instances = set(uids)
    if not framed:
        if len(instances) != len(uids):
            raise ReportError(
                "slices share a SOP Instance UID but the report names no frame numbers (a "
                "report of schema 2.3 or older, from an Enhanced multi-frame series); re-run "
                "the job to write DICOM SEG/SR for it"
            )
        return
    if len(instances) > 1:  # frames of one Enhanced instance, or single-frame images only
        raise SourceFramesError(
            f"the volume's slices come from {len(instances)} instances, {len(framed)} of "
            "them Enhanced (multi-frame); a DICOM SEG references single-frame images or "
            "the frames of one multi-frame image (highdicom 0.28 builds it from one "
            "multi-frame source), so such a series is refused before inference when results "
            f"go back as DICOM; {_SEND_AS}"
        )
    if len(set(frame_numbers)) != len(frame_numbers):
        raise ReportError("two slices of the volume name the same source frame; re-run the job")


def check_multiframe_source(header: Dataset) -> None:
    """Refuse an Enhanced source whose frames do not share one orientation and pixel
    spacing (e.g. localizer frames of another plane in the same instance): a SEG of it
    would need per-frame orientation, which highdicom 0.28 cannot take from its source."""
    for sequence, keyword, what in _SHARED_GEOMETRY:
        values = _frame_values(header, sequence, keyword)
        if values is None:
            raise SourceFramesError(
                f"the Enhanced source instance has no {what} ({sequence} > {keyword}) for "
                "every frame, so a DICOM SEG cannot be placed on it"
            )
        if not np.allclose(values, values[0], rtol=0, atol=_TOLERANCE):
            distinct = len({tuple(np.round(v, 3)) for v in values})
            raise SourceFramesError(
                f"the frames of the Enhanced source instance differ in {what} ({distinct} "
                "values); a DICOM SEG references a multi-frame source only when all its "
                "frames share one (highdicom 0.28 reads it from the shared functional "
                f"groups), so such a series is refused; {_SEND_AS}"
            )


def check_loaded_references(loaded: LoadedSeries) -> None:
    """Before inference: refuse a loaded series whose results DICOM SEG/SR could not
    reference (the same rules the writers apply, on what ingest recorded)."""
    slices = loaded.source_slices
    check_slice_references([s.sop_instance_uid for s in slices], [s.frame_number for s in slices])
    if slices and slices[0].frame_number is not None and slices[0].source.member is None:
        check_multiframe_source(pydicom.dcmread(slices[0].source.path, stop_before_pixels=True))


def share_frame_geometry(header: Dataset) -> None:
    """Put Plane Orientation and Pixel Measures in the shared functional groups of
    ``header``, in place (call it on highdicom's own copy). Scanners may repeat them in
    every frame's groups instead (same values, checked by :func:`check_multiframe_source`);
    highdicom reads them from the shared item only, so the first frame's are put there."""
    shared = header.SharedFunctionalGroupsSequence[0]
    first = header.PerFrameFunctionalGroupsSequence[0]
    for sequence, keyword, _ in _SHARED_GEOMETRY:
        if not _has(shared, sequence, keyword):
            setattr(shared, sequence, copy.deepcopy(first.get(sequence)))


def plane_positions(
    header: Dataset, frame_numbers: Sequence[int]
) -> list[hd.PlanePositionSequence]:
    """The frames' own Plane Position (Patient) items, so highdicom matches each SEG plane
    to exactly its source frame (it references frames by matching positions)."""
    per_frame = header.PerFrameFunctionalGroupsSequence
    return [
        hd.PlanePositionSequence.from_sequence(per_frame[n - 1].PlanePositionSequence)
        for n in frame_numbers
    ]


def _has(item: Dataset, sequence: str, keyword: str) -> bool:
    return bool(item.get(sequence)) and keyword in item.get(sequence)[0]


def _frame_values(header: Dataset, sequence: str, keyword: str) -> np.ndarray | None:
    """``keyword`` of every frame (shared, else per frame), or None where one lacks it."""
    shared_items = header.get("SharedFunctionalGroupsSequence") or [Dataset()]
    if _has(shared_items[0], sequence, keyword):
        return np.asarray([getattr(shared_items[0].get(sequence)[0], keyword)], dtype=float)
    values = []
    for frame in header.get("PerFrameFunctionalGroupsSequence") or []:
        if not _has(frame, sequence, keyword):
            return None
        values.append([float(v) for v in getattr(frame.get(sequence)[0], keyword)])
    return np.asarray(values, dtype=float) if values else None
