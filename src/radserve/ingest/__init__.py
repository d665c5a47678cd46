"""DICOM (folder, zip, files) and NIfTI in, :class:`~radserve.domain.volume.Volume` out.

The only package that reads DICOM pixel data. ``discover_series`` reads headers once and
groups them; ``load_series`` decodes one series under an :class:`IngestPolicy`.

The names below are imported on first use (PEP 562): the JPEG 2000 decoder processes
import ``radserve.ingest.decode`` and should not load nibabel and SciPy with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radserve.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from radserve.ingest.discover import SeriesHeader, discover_series
    from radserve.ingest.headers import FrameRef, PatientInfo
    from radserve.ingest.load import (
        LoadedSeries,
        LoadedStudy,
        RejectedSeries,
        SliceSource,
        load_series,
        load_study,
    )
    from radserve.ingest.nifti import load_nifti, save_nifti
    from radserve.ingest.policy import IngestPolicy
    from radserve.ingest.sources import (
        ArchiveRejectedError,
        InputTooLargeError,
        SkipKind,
        SkippedFile,
        SourceFile,
    )
    from radserve.ingest.validate import InstanceError, SeriesAttributeError

_EXPORTS = {
    "ArchiveRejectedError": "sources",
    "FrameRef": "headers",
    "InputTooLargeError": "sources",
    "InstanceError": "validate",
    "SeriesAttributeError": "validate",
    "IngestPolicy": "policy",
    "LoadedSeries": "load",
    "LoadedStudy": "load",
    "PatientInfo": "headers",
    "RejectedSeries": "load",
    "SeriesHeader": "discover",
    "SkipKind": "sources",
    "SkippedFile": "sources",
    "SliceSource": "load",
    "SourceFile": "sources",
    "discover_series": "discover",
    "load_nifti": "nifti",
    "load_series": "load",
    "load_study": "load",
    "save_nifti": "nifti",
}

__all__ = [
    "ArchiveRejectedError",
    "FrameRef",
    "IngestPolicy",
    "InputTooLargeError",
    "InstanceError",
    "LoadedSeries",
    "LoadedStudy",
    "PatientInfo",
    "RejectedSeries",
    "SeriesAttributeError",
    "SeriesHeader",
    "SkipKind",
    "SkippedFile",
    "SliceSource",
    "SourceFile",
    "discover_series",
    "load_nifti",
    "load_series",
    "load_study",
    "save_nifti",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
