"""Where instances come from: files, folders (recursive) and zip archives.

Zip members are read in memory, never extracted, so there is nothing to clean up and no
path a member name could escape to. Members with unsafe names are still skipped (they
signal a hostile or broken archive), and the declared uncompressed size is capped before
anything is read: zipfile stops each member at its declared size and checks its CRC.
"""

from __future__ import annotations

import io
import os
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, cast

from radserve.errors import StudyError

DEFAULT_MAX_ARCHIVE_BYTES = 8 * 2**30
"""Largest total uncompressed size accepted from one zip archive."""

DEFAULT_MAX_ARCHIVE_MEMBERS = 200_000


@dataclass(frozen=True, order=True)
class SourceFile:
    """One file on disk, or one member of a zip archive on disk."""

    path: Path
    member: str | None = None

    def __str__(self) -> str:
        return f"{self.path}!{self.member}" if self.member is not None else str(self.path)

    @property
    def name(self) -> str:
        """Short name for messages: the file or member name without folders."""
        return PurePosixPath(self.member).name if self.member is not None else self.path.name


@dataclass(frozen=True)
class SkippedFile:
    """A file that contributed nothing to any volume, and why."""

    source: SourceFile
    reason: str


class ArchiveRejectedError(StudyError):
    """A zip archive is unsafe to read (too large, too many members)."""

    code = "archive_rejected"


def expand_sources(
    sources: Path | str | Sequence[Path | str],
    *,
    max_archive_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
) -> tuple[list[SourceFile], list[SkippedFile]]:
    """Turn folders, zips and files into candidate files, listing what cannot be a file."""
    roots = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    found: list[SourceFile] = []
    skipped: list[SkippedFile] = []
    for root in map(Path, roots):
        if root.is_dir():
            for path in _walk(root):
                _add_file(path, found, skipped, max_archive_bytes)
        elif root.is_file():
            _add_file(root, found, skipped, max_archive_bytes)
        else:
            skipped.append(SkippedFile(SourceFile(root), "does not exist or is not a file"))
    return found, skipped


def _walk(root: Path) -> Iterator[Path]:
    """Files below ``root`` in a stable order; symlinked folders are not followed (loops)."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            yield Path(folder) / name


def _add_file(
    path: Path, found: list[SourceFile], skipped: list[SkippedFile], max_bytes: int
) -> None:
    if not path.is_file():  # FIFOs and devices would block or never end
        skipped.append(SkippedFile(SourceFile(path), "not a regular file"))
        return
    if path.suffix.lower() != ".zip":
        found.append(SourceFile(path))
        return
    try:
        members, bad = _zip_members(path, max_bytes)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        skipped.append(SkippedFile(SourceFile(path), f"not a readable zip archive ({exc})"))
        return
    found.extend(members)
    skipped.extend(bad)


def _zip_members(path: Path, max_bytes: int) -> tuple[list[SourceFile], list[SkippedFile]]:
    members: list[SourceFile] = []
    bad: list[SkippedFile] = []
    with zipfile.ZipFile(path) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        if len(infos) > DEFAULT_MAX_ARCHIVE_MEMBERS:
            raise ArchiveRejectedError(
                f"zip archive has {len(infos)} members; at most "
                f"{DEFAULT_MAX_ARCHIVE_MEMBERS} are accepted"
            )
        total = sum(i.file_size for i in infos)
        if total > max_bytes:
            raise ArchiveRejectedError(
                f"zip archive would unpack to {total} bytes, more than the "
                f"limit of {max_bytes} bytes (possible zip bomb); split the upload or raise "
                "max_archive_bytes"
            )
        for info in infos:
            src = SourceFile(path, info.filename)
            if not _is_safe_member_name(info.filename):
                bad.append(SkippedFile(src, "unsafe member path in zip (absolute or '..')"))
            elif info.flag_bits & 0x1:
                bad.append(SkippedFile(src, "encrypted zip member"))
            elif info.filename.lower().endswith(".zip"):
                bad.append(SkippedFile(src, "nested zip archives are not read"))
            else:
                members.append(src)
    return members, bad


def _is_safe_member_name(name: str) -> bool:
    posix = PurePosixPath(name.replace("\\", "/"))
    return not (posix.is_absolute() or ".." in posix.parts or ":" in posix.parts[0])


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
        with lock, zf.open(src.member) as fh:
            yield cast(BinaryIO, fh)

    def read_bytes(self, src: SourceFile) -> bytes:
        """The whole file or member."""
        if src.member is None:
            return src.path.read_bytes()
        zf, lock = self._archive(src.path)
        with lock:
            return zf.read(src.member)

    def pixel_source(self, src: SourceFile) -> str | BinaryIO:
        """What pydicom's pixel functions accept: a path, or the member's bytes in memory."""
        if src.member is None:
            return str(src.path)
        return io.BytesIO(self.read_bytes(src))
