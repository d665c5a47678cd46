"""How many entries a zip archive lists, read from its end record alone.

Kept apart from :mod:`radserve.ingest` (standard library only): the upload's door
(:mod:`radserve.service.sniff`) refuses an archive of too many members before anything
parses its central directory, and an API reader process, which imports the door's
module, must not load the ingest code (tests/unit/test_api_readers_imports.py).
"""

from __future__ import annotations

import os
import struct
import zipfile
from pathlib import PurePosixPath
from typing import BinaryIO

from radserve.errors import StudyError

DEFAULT_MAX_ARCHIVE_MEMBERS = 50_000
"""Most entries one zip archive's central directory may list (``ingest.max_archive_members``):
read from its end record before the directory is parsed. zipfile builds a ZipInfo per
entry (~600 bytes of Python objects each, whatever the entry holds) and discovery opens
every member: 200,000 empty members took ~13 s and ~270 MB to sniff at the door and
~100 s to discover (2026-12-06 probe), where the limit was only checked after parsing."""


DEFAULT_MAX_ARCHIVE_BYTES = 8 * 2**30
"""Largest total uncompressed size accepted from one zip archive."""


class ArchiveRejectedError(StudyError):
    """A zip archive is unsafe to read (too large, too many members)."""

    code = "archive_rejected"


_EOCD = b"PK\x05\x06"  # end of central directory record: 22 bytes + a comment
_EOCD_SIZE = 22
_ZIP64_LOCATOR = b"PK\x06\x07"  # 20 bytes, just before the end record
_ZIP64_EOCD = b"PK\x06\x06"
_MAX_COMMENT = 0xFFFF


def zip_directory(stream: BinaryIO) -> tuple[int, int] | None:
    """How many entries a zip archive's central directory lists and how many bytes it
    takes, from its end record (and the ZIP64 one: the larger count, its size), without
    parsing the directory; None when no end record is found (zipfile then says what is
    wrong). zipfile reads and parses the directory's bytes whatever count the end record
    gives: the size bounds what parsing it costs. The stream is left at offset 0."""
    try:
        size = stream.seek(0, os.SEEK_END)
        start = max(0, size - _EOCD_SIZE - _MAX_COMMENT)
        stream.seek(start)
        tail = stream.read(size - start)
        at = tail.rfind(_EOCD)
        if at < 0 or len(tail) - at < _EOCD_SIZE:
            return None
        count, directory = struct.unpack_from("<HI", tail, at + 10)
        locator = at - 20
        if locator >= 0 and tail[locator : locator + 4] == _ZIP64_LOCATOR:
            (offset,) = struct.unpack_from("<Q", tail, locator + 8)
            # an offset past the file (up to 2**64 - 1) raised OverflowError from seek:
            # HTTP 500 at POST /v1/studies and POST /v1/models (2026-12-08 trial)
            record = b""
            if offset <= size - 56:
                stream.seek(offset)
                record = stream.read(56)
            if len(record) == 56 and record[:4] == _ZIP64_EOCD:
                # zipfile reads the ZIP64 record's size (the end record's is 0xFFFFFFFF)
                count64, directory = struct.unpack_from("<QQ", record, 32)
                count = max(count, count64)
        return int(count), int(directory)
    finally:
        stream.seek(0)


def zip_member_count(stream: BinaryIO) -> int | None:
    """The entries a zip archive's central directory says it lists, from its end record
    (and the ZIP64 one), without parsing the directory; None when no end record is found
    (zipfile then says what is wrong). The stream is left at offset 0."""
    listed = zip_directory(stream)
    return None if listed is None else listed[0]


def check_member_count(stream: BinaryIO, max_members: int) -> None:
    """Refuse (:class:`ArchiveRejectedError`) a zip archive whose end record lists more
    than ``max_members`` entries, before zipfile parses its central directory."""
    count = zip_member_count(stream)
    if count is not None and count > max_members:
        raise ArchiveRejectedError(too_many_members(count, max_members))


# what zipfile inflates: Deflate64 (method 9), which Windows' Explorer writes for large
# archives, raised NotImplementedError as each such member was read ("unreadable file")
_READABLE_METHODS = frozenset(
    {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
)


ENCRYPTED = "encrypted"


def unreadable_member(info: zipfile.ZipInfo) -> str | None:
    """Why zipfile cannot read a member at all, said before it is opened: :data:`ENCRYPTED`,
    or its compression method (e.g. "compression method 9 (deflate64) is not
    supported"); None for one it can. The one rule for ingest and model bundles."""
    if info.flag_bits & 0x1:
        return ENCRYPTED
    if info.compress_type not in _READABLE_METHODS:
        method = zipfile.compressor_names.get(info.compress_type, "unknown")
        return f"compression method {info.compress_type} ({method}) is not supported"
    return None


def member_problem(info: zipfile.ZipInfo) -> str | None:
    """Why ingest skips an archive member (a file's entry, not a folder's), or None for
    one it reads: the one rule for ingest and for the study's fingerprint
    (:func:`radserve.store.files.archive_member_digests`)."""
    if not _is_safe_member_name(info.filename):
        return "unsafe member path in zip (absolute or '..')"
    unreadable = unreadable_member(info)
    if unreadable == ENCRYPTED:
        return "encrypted zip member"
    if unreadable:
        return f"unreadable zip member: {unreadable}; zip the files with Deflate"
    if info.filename.lower().endswith(".zip"):
        return "nested zip archives are not read"
    return None


def _is_safe_member_name(name: str) -> bool:
    posix = PurePosixPath(name.replace("\\", "/"))
    return not (posix.is_absolute() or ".." in posix.parts or ":" in posix.parts[0])


def too_many_members(count: int, limit: int) -> str:
    return (
        f"zip archive lists {count} members, more than ingest.max_archive_members={limit}: "
        "split the study into smaller archives (or send its files as they are), or raise "
        "the limit"
    )


__all__ = [
    "DEFAULT_MAX_ARCHIVE_BYTES",
    "DEFAULT_MAX_ARCHIVE_MEMBERS",
    "ArchiveRejectedError",
    "check_member_count",
    "member_problem",
    "too_many_members",
    "zip_directory",
    "zip_member_count",
]
