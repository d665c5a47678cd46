"""The attributes the priority rules read (and the routing's Study Instance UID), from a
stored study or from an upload's streams before anything is stored: the first DICOM
file's header, or the first DICOM member of a zip archive; header only."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from radserve.ingest.attributes import priority_attributes, read_priority_attributes
from radserve.ingest.headers import read_header

_ZIP_PROBE = 20  # zip members tried for priority attributes
_ZIP_PROBE_BYTES = 64 * 1024**2


def study_attributes(study_dir: Path, keywords: Sequence[str]) -> dict[str, str]:
    """The attributes the priority rules read, from the first DICOM file of a stored
    study, or from the first DICOM member of its first zip archive (header only)."""
    attributes = read_priority_attributes(study_dir, keywords)
    if attributes:
        return attributes
    for archive in sorted(Path(study_dir).glob("*.zip")):
        try:
            with zipfile.ZipFile(archive) as zf:
                found = _archive_attributes(zf, keywords)
            if found is not None:
                return found
        except (zipfile.BadZipFile, OSError):
            continue
    return {}


def _archive_attributes(zf: zipfile.ZipFile, keywords: Sequence[str]) -> dict[str, str] | None:
    """The attributes of the first readable DICOM member among the archive's first
    ``_ZIP_PROBE`` (members over ``_ZIP_PROBE_BYTES`` skipped), or None."""
    for info in zf.infolist()[:_ZIP_PROBE]:
        if info.is_dir() or info.file_size > _ZIP_PROBE_BYTES:
            continue
        found = _member_attributes(zf, info, keywords)
        if found is not None:
            return found
    return None


def _member_attributes(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, keywords: Sequence[str]
) -> dict[str, str] | None:
    """The attributes of one archive member, read while it is open (large values are
    read on use), or None when it is not readable DICOM."""
    try:
        with zf.open(info) as member:
            return priority_attributes(read_header(member), keywords)
    except Exception:  # not DICOM: the caller tries the next member
        return None


def stream_attributes(streams: Sequence[BinaryIO], keywords: Sequence[str]) -> dict[str, str]:
    """The attributes the priority rules read, from the first DICOM stream (or the first
    DICOM member of a zip stream) of an upload, before anything is stored; header only,
    large elements deferred. Every stream is left at its start."""
    for stream in streams:
        try:
            if zipfile.is_zipfile(stream):
                stream.seek(0)
                with zipfile.ZipFile(stream) as zf:
                    found = _archive_attributes(zf, keywords)
                if found is not None:
                    return found
                continue
            stream.seek(0)
            ds = read_header(stream)
            return priority_attributes(ds, keywords)
        except Exception:  # not DICOM (NIfTI, garbage the sniffer let through): next
            continue
        finally:
            stream.seek(0)
    return {}


__all__ = ["stream_attributes", "study_attributes"]
