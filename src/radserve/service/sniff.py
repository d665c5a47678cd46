"""What kind of file an upload is, from its first bytes (never from its name).

Cheap enough to run on every file before anything is stored, so an upload of a PDF or
a photo is refused at once (415) instead of becoming a failed job, and a zip archive
that holds no files as an upload of no files (400 ``empty_upload``).
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

from radserve.errors import EmptyUploadError
from radserve.service.errors import UnsupportedMediaError
from radserve.zip_members import (
    DEFAULT_MAX_ARCHIVE_MEMBERS,
    ArchiveRejectedError,
    check_member_count,
)

_HEAD = 548
# compressed bytes read to inflate a gzip upload's first _HEAD bytes: deflate's worst
# case (stored blocks) adds 5 bytes per 64 KiB, so this holds them with room to spare
_GZIP_PEEK = 4096


class FileKind(StrEnum):
    DICOM = "dicom"
    ZIP = "zip"
    NIFTI = "nifti"
    NIFTI_GZ = "nifti_gz"

    @property
    def suffix(self) -> str:
        """The suffix the stored copy gets (readers choose a format by it)."""
        return {"dicom": ".dcm", "zip": ".zip", "nifti": ".nii", "nifti_gz": ".nii.gz"}[self]


NIFTI_STORED = (FileKind.NIFTI.suffix, FileKind.NIFTI_GZ.suffix)


def input_kind(study_dir: Path) -> str:
    """``nifti`` for a stored study folder holding one NIfTI file (stored under the suffix
    its sniffed kind gave it), else ``dicom``."""
    files = [p for p in Path(study_dir).iterdir() if p.is_file()]
    if len(files) == 1 and files[0].name.lower().endswith(NIFTI_STORED):
        return "nifti"
    return "dicom"


def kind_of(head: bytes) -> FileKind | None:
    """The kind ``head`` (a file's first bytes) starts, or None."""
    if len(head) >= 132 and head[128:132] == b"DICM":
        return FileKind.DICOM
    # a local file header, or an archive of no members: only its end of central directory
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return FileKind.ZIP
    if head[:2] == b"\x1f\x8b":  # gzip: only NIfTI is accepted compressed this way
        return FileKind.NIFTI_GZ
    if len(head) >= 348:
        for order in ("<", ">"):
            size = struct.unpack(f"{order}i", head[:4])[0]
            if size == 348 and head[344:348] in (b"n+1\x00", b"ni1\x00"):
                return FileKind.NIFTI
            if size == 540 and head[4:8] in (b"n+2\x00", b"ni2\x00"):
                return FileKind.NIFTI
    # DICOM without the Part-10 preamble (old scanners): group 0x0002 or 0x0008 first
    if len(head) >= 8 and head[:2] in (b"\x02\x00", b"\x08\x00") and head[3:4] == b"\x00":
        return FileKind.DICOM
    return None


def sniff(
    stream: BinaryIO,
    position: int,
    total: int,
    *,
    max_archive_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
) -> FileKind:
    """The kind of an upload stream (left at offset 0). ``position`` (1-based) and
    ``total`` name the file in the error, because file names may hold patient names.
    A zip archive listing more than ``max_archive_members`` entries is refused here
    (``archive_rejected``, 422), from its end record, before any reader parses its
    central directory."""
    head = stream.read(_HEAD)
    stream.seek(0)
    kind = kind_of(head)
    if kind is None:
        what = "empty" if not head else "not DICOM, a zip archive or NIfTI"
        raise UnsupportedMediaError(
            f"file {position} of {total} is {what}; send DICOM Part-10 files, a zip of "
            "them, or one NIfTI volume (.nii / .nii.gz)"
        )
    if kind is FileKind.NIFTI_GZ:
        _check_gzip_holds_nifti(stream, position, total)
    if kind is FileKind.ZIP:
        try:
            check_member_count(stream, max_archive_members)
        except ArchiveRejectedError as exc:
            raise ArchiveRejectedError(f"file {position} of {total}: {exc.message}") from exc
    if kind is FileKind.ZIP and not _zip_holds_files(stream):
        raise EmptyUploadError(
            f"file {position} of {total} is a zip archive that holds no files; zip the "
            "study's DICOM files"
        )
    return kind


def _check_gzip_holds_nifti(stream: BinaryIO, position: int, total: int) -> None:
    """Refuse (415) a gzip stream whose first inflated bytes are not a NIfTI header: a
    gzipped text file, DICOM or tar became a job that failed (``nifti_invalid``) instead
    of a refusal with nothing stored. At most :data:`_GZIP_PEEK` compressed bytes are
    read and :data:`_HEAD` inflated (a bomb costs nothing here); a stream that cannot
    be inflated that far is left to ingest, which names the damage."""
    inflater = zlib.decompressobj(wbits=31)  # gzip framing
    try:
        head = inflater.decompress(stream.read(_GZIP_PEEK), _HEAD)
    except zlib.error:
        head = b""
    finally:
        stream.seek(0)
    if len(head) < _HEAD and not inflater.eof:
        return  # damaged or oddly framed: ingest reads it and says what is wrong
    inner = kind_of(head)
    if inner is FileKind.NIFTI:
        return
    what = (
        {
            FileKind.DICOM: "a DICOM file",
            FileKind.ZIP: "a zip archive",
            FileKind.NIFTI_GZ: "gzip data again",
        }.get(inner)
        if inner is not None
        else "not DICOM, a zip archive or NIfTI"
    )
    raise UnsupportedMediaError(
        f"file {position} of {total} is gzip-compressed, but what it holds is not a NIfTI "
        f"volume ({what}); only NIfTI is accepted gzip-compressed (.nii.gz): send DICOM "
        "files uncompressed or in a zip"
    )


def _zip_holds_files(stream: BinaryIO) -> bool:
    """Whether a zip stream lists a file (not only folders) in its central directory
    (left at offset 0). A damaged archive counts as holding files: ingest reads it and
    says what is wrong, as before; only an archive that plainly holds nothing is an
    upload with no files."""
    try:
        with zipfile.ZipFile(stream) as archive:
            return any(not info.is_dir() for info in archive.infolist())
    except Exception:  # damaged (BadZipFile and whatever a hostile directory raises)
        return True
    finally:
        stream.seek(0)


def check_combination(kinds: list[FileKind]) -> None:
    """A study is DICOM files and/or zips, or exactly one NIfTI volume."""
    nifti = [k for k in kinds if k in (FileKind.NIFTI, FileKind.NIFTI_GZ)]
    if nifti and len(kinds) > 1:
        raise UnsupportedMediaError(
            f"a NIfTI volume must be uploaded alone (got {len(kinds)} files, {len(nifti)} "
            "NIfTI): send one study per request, or use the batch endpoint"
        )


__all__ = ["FileKind", "check_combination", "kind_of", "sniff"]
