"""REST uploads without radserve's own results (see :mod:`radserve.gateway.own_results`).

A client that exports a whole study from a PACS and uploads it (files or a zip) sends
radserve's earlier SEG/SR/SC with it. Those are dropped before the study is stored, so
the stored study — and its fingerprint, which the result cache and the unchanged-re-send
check key on — holds only source instances. A zip with none of them is stored as it came;
one with some is stored as its other members (read straight from the archive).
"""

from __future__ import annotations

import contextlib
import logging
import zipfile
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from pydicom.dataset import Dataset

from radserve.errors import StudyError
from radserve.gateway.own_results import OwnResults
from radserve.ingest.headers import read_header
from radserve.service.sniff import FileKind

logger = logging.getLogger(__name__)

UPLOAD = "upload"
_MEMBER_LIMIT = 100_000  # members inspected per archive (a bound, not a policy)


class OwnResultsOnlyError(StudyError):
    """Everything uploaded was radserve's own results: there is nothing to analyse."""

    code = "own_results_only"


def _header(stream: BinaryIO) -> Dataset | None:
    """The header (bounded: :func:`~radserve.ingest.headers.read_header`), or None. A plain
    ``dcmread`` inflated a Deflated upload whole and read every element into memory: a
    zip member or Deflated file of a few MB took the server up by gigabytes before
    ingest's bounded read ever saw it (found by reading, tests/fuzz instance target)."""
    try:
        return read_header(stream)
    except Exception:  # not DICOM, or damaged: left for ingest to judge
        return None
    finally:
        with contextlib.suppress(OSError, ValueError):
            stream.seek(0)


@contextlib.contextmanager
def without_own_results(
    files: Sequence[BinaryIO],
    kinds: Sequence[FileKind],
    own: OwnResults,
    *,
    seen: Callable[[Dataset], object] | None = None,
) -> Iterator[list[tuple[str, BinaryIO]]]:
    """``(name, stream)`` pairs for :func:`radserve.store.files.store_study`, own results
    left out (logged and counted). Raises :class:`OwnResultsOnlyError` if nothing is left.
    Archive member streams stay open until the context ends. ``seen``: given each header
    read of an instance kept (a file or a zip member; small values only, while it is
    open), so the upload's other checks need not read them again."""
    kept: list[tuple[str, BinaryIO]] = []
    dropped = 0
    with contextlib.ExitStack() as stack:
        for kind, stream in zip(kinds, files, strict=True):
            if kind is FileKind.DICOM:
                header = _header(stream)
                if header is not None and own.check(header, UPLOAD):
                    dropped += 1
                    continue
                if header is not None and seen is not None:
                    seen(header)
                    stream.seek(0)  # a deferred value read moves the stream
            if kind is FileKind.ZIP:
                members, skipped = _zip_members(stream, own, stack, seen)
                if skipped:
                    dropped += skipped
                    kept += members
                    continue
            kept.append((f"{UPLOAD}{kind.suffix}", stream))
        if not kept:
            raise OwnResultsOnlyError(
                f"the upload holds only radserve's own results ({dropped} instance(s): SEG, "
                "SR or key images it wrote); send the source images to analyse"
            )
        if dropped:
            logger.info("upload: %d own result instance(s) left out", dropped)
        yield kept


def _zip_members(
    stream: BinaryIO,
    own: OwnResults,
    stack: contextlib.ExitStack,
    seen: Callable[[Dataset], object] | None = None,
) -> tuple[list[tuple[str, BinaryIO]], int]:
    """The archive's members that are not own results, and how many were; ``([], 0)``
    when it holds none (or is not a readable zip: ingest reports that)."""
    try:
        archive = zipfile.ZipFile(stream)
        infos = [i for i in archive.infolist()[:_MEMBER_LIMIT] if not i.is_dir()]
        own_members = set()
        for info in infos:
            with archive.open(info) as member:
                header = _header(member)  # type: ignore[arg-type]
                if header is not None and own.check(header, UPLOAD):
                    own_members.add(info.filename)
                elif header is not None and seen is not None:
                    seen(header)
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError):
        stream.seek(0)
        return [], 0
    if not own_members:
        stream.seek(0)
        return [], 0
    stack.enter_context(archive)
    kept = [
        (_member_name(info.filename), stack.enter_context(archive.open(info)))
        for info in infos
        if info.filename not in own_members
    ]
    return kept, len(own_members)  # type: ignore[return-value]


def _member_name(name: str) -> str:
    """Only the suffix matters to the store; a member without one is read as DICOM."""
    lower = name.lower()
    for suffix in (".nii.gz", ".nii", ".zip", ".dcm"):
        if lower.endswith(suffix):
            return f"member{suffix}"
    return "member.dcm"


__all__ = ["OwnResultsOnlyError", "without_own_results"]
