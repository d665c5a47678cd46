"""Where instances come from: files, folders (recursive) and zip archives.

Zip members are never extracted under their own names, so there is no path a member
name could escape to. Members with unsafe names are still skipped (they signal a hostile
or broken archive), and the declared uncompressed size is capped before anything is
read. Declared sizes are not trusted for memory: every read goes through
:class:`BoundedStream`, which counts the bytes actually returned and refuses a read that
would pass its limit before making it, and a member decoded for pixels is copied to a
spooled temporary file (on disk past :data:`SPOOL_BYTES`), never into one bytes object.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import BinaryIO, cast

from radserve.errors import StudyError
from radserve.zip_members import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_ARCHIVE_MEMBERS,
    ArchiveRejectedError,
    check_member_count,
    member_problem,
    too_many_members,
)

SPOOL_BYTES = 16 * 2**20
"""A zip member copied for decoding stays in memory up to this size, then goes to disk."""


@dataclass(frozen=True, order=True)
class SourceFile:
    """One file on disk, or one member of a zip archive on disk."""

    path: Path
    member: str | None = None
    # the member's place in the archive's central directory: two members may share a
    # name, and opening by name read the last of them twice (a slice silently lost)
    entry: int | None = None

    def __str__(self) -> str:
        return f"{self.path}!{self.member}" if self.member is not None else str(self.path)

    @property
    def name(self) -> str:
        """Short name for messages: the file or member name without folders."""
        return PurePosixPath(self.member).name if self.member is not None else self.path.name


class SkipKind(StrEnum):
    """What a skipped file is, as code reads it: ``reason`` says it in words, for people.

    Every place that skips a file names its kind (no default), so a new reason is sorted
    where it is made: ingest reports each :attr:`UNREADABLE` file in the warnings of the
    series it loads (:func:`radserve.ingest.load.load_series`), and in the gap it may
    leave. Before, those were picked out by their reasons' first words: "DICOM without
    SOP Class/...", a header cut after 300 bytes, matched none, and a study ran 35 of
    its 40 slices without a word (2026-12-07)."""

    UNREADABLE = "unreadable"
    """May be an image of any series, but its header could not be read: damaged, cut,
    zero-filled, over a bound, or a zip member (or archive) radserve could not open."""
    NOT_DICOM = "not_dicom"  # plainly another format (text, PDF, a picture, ...)
    NOT_IMAGE = "not_image"  # DICOM, but no image (SR, DICOMDIR, presentation state)
    NOT_A_FILE = "not_a_file"  # a FIFO, a device, a path that does not exist
    COPY = "copy"  # another copy of an instance already found
    SET_ASIDE = "set_aside"  # read, and kept out of its series' volume (a localizer)


@dataclass(frozen=True)
class SkippedFile:
    """A file that contributed nothing to any volume, why (``reason``: words, never a
    name or a value of the file) and what it is (``kind``)."""

    source: SourceFile
    reason: str
    kind: SkipKind


class InputTooLargeError(StudyError):
    """An input would need more bytes (of memory, disk or reading) than the ingest
    limits allow: a file, a header, a study, a frame count."""

    code = "input_too_large"


class BoundedStream:
    """A read-only view of a binary stream that refuses to read past ``limit`` bytes.

    Reads are counted (seeks are free: skipping a large element costs no memory), and a
    read that would pass the limit raises :class:`InputTooLargeError` *before* it is
    made, so a header claiming a 2 GB element never allocates it. ``what`` names the
    limit in the error (a setting the user can raise).
    """

    def __init__(
        self, raw: BinaryIO, limit: int, what: str, *, max_elements: int | None = None
    ) -> None:
        self._raw = raw
        self.limit = limit
        self.what = what
        self.count = 0
        self.max_elements = max_elements
        self.elements = 0

    def count_element(self, size: int | None) -> None:
        """pydicom reads every element header, item and delimiter as 8 bytes: counting
        those reads (8-byte values count too: at most twice the elements) bounds the
        Python objects a header becomes, which ``limit`` alone does not (1,000,000
        elements of 10 bytes are 10 MB of header and 760 MB of objects)."""
        if size != 8 or self.max_elements is None:
            return
        self.elements += 1
        if self.elements > self.max_elements:
            raise InputTooLargeError(
                f"the header holds more than {self.max_elements} data elements, more than "
                "ingest.max_header_elements (each costs memory whatever its size)"
            )

    def read(self, size: int | None = -1) -> bytes:
        self.count_element(size)
        remaining = self.limit - self.count
        if size is None or size < 0:
            data = self._raw.read(remaining + 1)
        elif size > remaining:
            raise self._error(self.count + size)
        else:
            data = self._raw.read(size)
        self.count += len(data)
        if self.count > self.limit:
            raise self._error(self.count)
        return data

    def _error(self, wanted: int) -> InputTooLargeError:
        return InputTooLargeError(
            f"reading would need at least {wanted} bytes, more than {self.what}={self.limit}"
        )

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset`` (the position is left after them),
        counted against the limit but never as an element: a few bytes peeked at, such
        as a compressed frame's own header."""
        if size > self.limit - self.count:
            raise self._error(self.count + size)
        self._raw.seek(offset)
        data = self._raw.read(size)
        self.count += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return bool(getattr(self._raw, "closed", False))


def expand_sources(
    sources: Path | str | Sequence[Path | str],
    *,
    max_archive_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
    max_archive_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
) -> tuple[list[SourceFile], list[SkippedFile]]:
    """Turn folders, zips and files into candidate files, listing what cannot be a file."""
    roots = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    found: list[SourceFile] = []
    skipped: list[SkippedFile] = []
    limits = (max_archive_bytes, max_archive_members)
    for root in map(Path, roots):
        if root.is_dir():
            for path in _walk(root):
                _add_file(path, found, skipped, *limits)
        elif root.is_file():
            _add_file(root, found, skipped, *limits)
        else:
            skipped.append(
                SkippedFile(
                    SourceFile(root), "does not exist or is not a file", SkipKind.NOT_A_FILE
                )
            )
    return found, skipped


def _walk(root: Path) -> Iterator[Path]:
    """Files below ``root`` in a stable order; symlinked folders are not followed (loops)."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            yield Path(folder) / name


def _add_file(
    path: Path,
    found: list[SourceFile],
    skipped: list[SkippedFile],
    max_bytes: int,
    max_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
) -> None:
    if not path.is_file():  # FIFOs and devices would block or never end
        skipped.append(SkippedFile(SourceFile(path), "not a regular file", SkipKind.NOT_A_FILE))
        return
    if path.suffix.lower() != ".zip":
        found.append(SourceFile(path))
        return
    try:
        members, bad = _zip_members(path, max_bytes, max_members)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        # an OSError's text quotes the path (the data dir's, or the sender's folders):
        # the reason reaches job errors, so only what went wrong is said
        said = (exc.strerror or type(exc).__name__) if isinstance(exc, OSError) else exc
        # the study's images may be in it: reported as an unreadable file
        reason = f"not a readable zip archive ({said})"
        skipped.append(SkippedFile(SourceFile(path), reason, SkipKind.UNREADABLE))
        return
    found.extend(members)
    skipped.extend(bad)


def _zip_members(
    path: Path, max_bytes: int, max_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS
) -> tuple[list[SourceFile], list[SkippedFile]]:
    members: list[SourceFile] = []
    bad: list[SkippedFile] = []
    with path.open("rb") as raw:
        check_member_count(raw, max_members)
    with zipfile.ZipFile(path) as zf:
        infos = [(n, i) for n, i in enumerate(zf.infolist()) if not i.is_dir()]
        if len(infos) > max_members:  # the end record understated them
            raise ArchiveRejectedError(too_many_members(len(infos), max_members))
        total = sum(i.file_size for _, i in infos)
        if total > max_bytes:
            raise ArchiveRejectedError(
                f"zip archive would unpack to {total} bytes, more than the "
                f"limit of {max_bytes} bytes (possible zip bomb); split the upload or raise "
                "max_archive_bytes"
            )
        for entry, info in infos:
            src = SourceFile(path, info.filename, entry)
            problem = member_problem(info)
            if problem is not None:  # any member not read may be one of the study's images
                bad.append(SkippedFile(src, problem, SkipKind.UNREADABLE))
            else:
                members.append(src)
    return members, bad


def _info(zf: zipfile.ZipFile, src: SourceFile) -> zipfile.ZipInfo:
    """The member ``src`` names: by its place in the central directory when known."""
    assert src.member is not None
    return zf.infolist()[src.entry] if src.entry is not None else zf.getinfo(src.member)


class SourceReader:
    """Opens :class:`SourceFile`\\ s; keeps one handle per archive, shared by threads.

    Reads from one archive are serialised by a lock (zip decompression is cheap next to
    pixel decoding); reads from plain files need no lock.
    """

    def __init__(self) -> None:
        self._archives: dict[Path, tuple[zipfile.ZipFile, threading.Lock]] = {}
        self._guard = threading.Lock()

    def __enter__(self) -> SourceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._guard:
            for zf, _ in self._archives.values():
                zf.close()
            self._archives.clear()

    def _archive(self, path: Path) -> tuple[zipfile.ZipFile, threading.Lock]:
        with self._guard:
            if path not in self._archives:
                self._archives[path] = (zipfile.ZipFile(path), threading.Lock())
            return self._archives[path]

    @contextmanager
    def open(self, src: SourceFile) -> Iterator[BinaryIO]:
        """A seekable binary handle; for a zip member the archive stays locked meanwhile."""
        if src.member is None:
            with src.path.open("rb") as fh:
                yield fh
            return
        zf, lock = self._archive(src.path)
        with lock, zf.open(_info(zf, src)) as fh:
            yield cast(BinaryIO, fh)

    def size(self, src: SourceFile) -> int:
        """The file's size, or the member's declared uncompressed size (zipfile never
        returns more than that, and checks the CRC when the member is read to its end)."""
        if src.member is None:
            return src.path.stat().st_size
        zf, _ = self._archive(src.path)
        return _info(zf, src).file_size  # the central directory: no read, no lock

    @contextmanager
    def pixel_source(self, src: SourceFile, max_bytes: int) -> Iterator[str | BinaryIO]:
        """What pydicom's pixel functions accept: the path of a plain file, or a member
        copied into a spooled temporary file (counted against ``max_bytes`` as read)."""
        if src.member is None:
            yield str(src.path)
            return
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as copy:
            self.copy(src, cast(BinaryIO, copy), max_bytes)
            copy.seek(0)
            yield cast(BinaryIO, copy)

    def copy(self, src: SourceFile, out: BinaryIO, max_bytes: int) -> None:
        """``src``'s bytes written to ``out``, counted against ``max_bytes`` as read
        (``ingest.max_file_bytes``: a member may inflate past what its archive said)."""
        with self.open(src) as fh:
            shutil.copyfileobj(BoundedStream(fh, max_bytes, "ingest.max_file_bytes"), out)


def copy_members(sources: Sequence[SourceFile], folder: Path, max_bytes: int) -> list[Path]:
    """``sources`` as plain files: a file on disk as it is, a zip member copied into
    ``folder`` (numbered by its place in ``sources``: member names may repeat or hold
    folders) under ``max_bytes`` (``ingest.max_file_bytes``). For readers that take paths
    (the DICOM SEG/SR writers), after ingest accepted the members."""
    files: list[Path] = []
    with SourceReader() as reader:
        for i, src in enumerate(sources):
            if src.member is None:
                files.append(src.path)
                continue
            target = folder / f"{i:06d}.dcm"
            with target.open("wb") as out:
                reader.copy(src, out, max_bytes)
            files.append(target)
    return files
