"""DICOM (folder, zip, files) and NIfTI in, :class:`~radserve.domain.volume.Volume` out.

The only package that reads DICOM pixel data. ``discover_series`` reads headers once and
groups them; ``load_series`` decodes one series under an :class:`IngestPolicy`.
"""

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
from radserve.ingest.sources import ArchiveRejectedError, SkippedFile, SourceFile

__all__ = [
    "ArchiveRejectedError",
    "FrameRef",
    "IngestPolicy",
    "LoadedSeries",
    "LoadedStudy",
    "PatientInfo",
    "RejectedSeries",
    "SeriesHeader",
    "SkippedFile",
    "SliceSource",
    "SourceFile",
    "discover_series",
    "load_nifti",
    "load_series",
    "load_study",
    "save_nifti",
]
