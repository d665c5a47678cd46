"""Content-addressed study storage under ``data_dir/studies/<fp[:2]>/<fp>/``.

A study's folder is named by its fingerprint (SHA-256 over the sorted SHA-256 of its
instances, a zip archive's members counted as instances), and each instance by its own
SHA-256, so identical uploads share one
folder and no file name carries what a sender put in it (names can hold patient
names). Files are streamed into a private staging folder, fsynced, and the folder is
renamed into place and its parents fsynced before :func:`store_study` returns: when
the caller then commits the job and answers 202, the bytes are on disk.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import lzma
import os
import shutil
import uuid
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from radserve import durable
from radserve.errors import EmptyUploadError, StudyError
from radserve.store.errors import StoreError
from radserve.zip_members import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_ARCHIVE_MEMBERS,
    member_problem,
    zip_directory,
)

logger = logging.getLogger(__name__)

STUDIES_DIR = "studies"
STAGING_DIR = "staging"
_CHUNK = 1 << 20
# suffixes kept on stored instances, because readers pick a format by them
_KEPT_SUFFIXES = (".nii.gz", ".nii", ".dcm", ".zip")


class UploadTooLargeError(StudyError):
    code = "upload_too_large"


class StorageUnavailableError(StoreError):
    """The data folder cannot be written (shared storage gone, read-only, full):
    nothing was stored, nothing is acknowledged; the sender may retry later."""

    code = "storage_unavailable"
    retryable = True


@dataclass(frozen=True)
class StoredStudy:
    fingerprint: str
    path: Path
    instances: tuple[Path, ...]
    total_bytes: int
    # True when an identical study was already stored (this upload added nothing)
    existed: bool


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint_digests(digests: Iterable[str]) -> str:
    """The study fingerprint from its instances' SHA-256 hex digests (order-free).

    A byte-identical instance sent twice is one instance: it is stored once and
    counted once.
    """
    return hashlib.sha256("\n".join(sorted(set(digests))).encode()).hexdigest()


def archive_member_digests(stream: BinaryIO) -> list[str] | None:
    """The SHA-256 of each file a zip archive holds, as if its files had been sent one by
    one, so a study has one fingerprint however it comes: as files, over STOW-RS, zipped,
    or zipped again (a zip's own bytes change with each member's time and the tool).
    Before session 43 the zip's bytes were the instance, and a study re-sent as a new zip
    of the same files was run again.

    None (the zip's own digest stands) when ingest would not read every member as it is
    (:func:`radserve.zip_members.member_problem`), past ingest's default bounds on
    members and unpacked bytes, or for an archive zipfile cannot read: ingest then says
    what is wrong. The stream is left at offset 0."""
    try:
        listed = zip_directory(stream)
        if listed is None or listed[0] > DEFAULT_MAX_ARCHIVE_MEMBERS:
            return None
        digests = []
        with zipfile.ZipFile(stream) as archive:
            infos = [info for info in archive.infolist() if not info.is_dir()]
            if len(infos) > DEFAULT_MAX_ARCHIVE_MEMBERS or any(map(member_problem, infos)):
                return None
            if sum(info.file_size for info in infos) > DEFAULT_MAX_ARCHIVE_BYTES:
                return None
            for info in infos:
                digest = hashlib.sha256()
                with archive.open(info) as member:  # checks the member's CRC at its end
                    while chunk := member.read(_CHUNK):
                        digest.update(chunk)
                digests.append(digest.hexdigest())
        return digests or None
    # damaged Deflate or LZMA data raised zlib.error or LZMAError, an encrypted member
    # RuntimeError: HTTP 500 at POST /v1/studies for a zip of DICOM files with one damaged
    # member (2026-12-08 trial); ingest then reads the members it can and names the others
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        EOFError,
        ValueError,
        OSError,
        RuntimeError,
        zlib.error,
        lzma.LZMAError,
    ):
        return None
    finally:
        stream.seek(0)


def fingerprint_files(paths: Sequence[Path]) -> str:
    """SHA-256 over the sorted SHA-256 of each input file (a zip's members in its place):
    the study's content identity, as :func:`store_study` gives it."""
    return fingerprint_digests(
        digest for p in paths for digest in _content_digests(Path(p), sha256_file(Path(p)))
    )


def study_dir(data_dir: Path, fingerprint: str) -> Path:
    return Path(data_dir) / STUDIES_DIR / fingerprint[:2] / fingerprint


def store_study(
    data_dir: Path,
    files: Iterable[tuple[str, BinaryIO]],
    *,
    max_bytes: int | None = None,
    before_publish: Callable[[Path], object] | None = None,
    modified_ns: Sequence[int] | None = None,
    check: Callable[[Path], object] | None = None,
) -> StoredStudy:
    """Write uploaded ``(original name, stream)`` pairs durably; return where they are.

    The original name is used only for its suffix (``.dcm``, ``.nii.gz``, ...).
    Raises :class:`UploadTooLargeError` past ``max_bytes`` (nothing is kept then).
    ``before_publish(folder)`` runs once the study's folder is known and before it is
    renamed into place (the marker of a study no job names yet: radserve.service.unclaimed).
    ``modified_ns``: each file's modification time, kept on its copy (else the copies are
    as new as their writing): ingest reads an instance received twice from the copy
    received last (:func:`radserve.ingest.discover.discover_series`).
    ``check(staging folder)`` runs once every file is written there, before anything is
    published: what it raises refuses the upload, and nothing is kept (the upload form's
    selection check, :mod:`radserve.service.selection_door`).
    """
    data_dir = Path(data_dir)
    staging = data_dir / STAGING_DIR / uuid.uuid4().hex
    try:
        staging.mkdir(parents=True)
        digests, total = _stage(staging, files, max_bytes, modified_ns)
        if not digests:
            raise EmptyUploadError("the upload holds no files")
        if check is not None:
            check(staging)
        durable.fsync_dir(staging)
        fingerprint = fingerprint_digests(digests)
        target = study_dir(data_dir, fingerprint)
        if before_publish is not None:
            before_publish(target)
        existed = _move_into_place(staging, target)
    except OSError as exc:  # writing the data folder failed: nothing is acknowledged
        raise StorageUnavailableError(
            f"the data folder cannot be written ({_os_error(exc)}): nothing was stored; retry later"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    instances = tuple(sorted(p for p in target.iterdir() if p.is_file()))
    logger.info(
        "study %s… stored: %d instance(s), %d bytes%s",
        fingerprint[:12],
        len(instances),
        total,
        " (already present)" if existed else "",
    )
    return StoredStudy(fingerprint, target, instances, total, existed)


def store_study_files(
    data_dir: Path,
    paths: Sequence[Path],
    *,
    max_bytes: int | None = None,
    before_publish: Callable[[Path], object] | None = None,
) -> StoredStudy:
    """:func:`store_study` for files already on disk (CLI submissions, the DICOM gateway,
    STOW-RS): each copy keeps its file's modification time, the order the instances
    were received in. Before session 35 the copies were as new as their writing, in the
    order of their names, so a study re-sent with a corrected name was read partly from
    the old copies and failed as naming two patients."""
    paths = [Path(p) for p in paths]
    with contextlib.ExitStack() as stack:
        streams = [(p.name, stack.enter_context(open(p, "rb"))) for p in paths]
        modified = [os.fstat(stream.fileno()).st_mtime_ns for _, stream in streams]
        return store_study(
            data_dir,
            streams,
            max_bytes=max_bytes,
            before_publish=before_publish,
            modified_ns=modified,
        )


def remove_stale_staging(data_dir: Path) -> int:
    """Delete staging folders left by uploads a crash interrupted; call before serving.

    Nothing in staging was acknowledged (a study is acknowledged only after its folder
    is renamed into ``studies/``), so all of it may go. Returns how many were removed.
    """
    staging = Path(data_dir) / STAGING_DIR
    if not staging.is_dir():
        return 0
    stale = [p for p in staging.iterdir() if p.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        logger.warning("removed %d interrupted upload(s) from %s", len(stale), staging)
    return len(stale)


def _suffix(name: str) -> str:
    lower = name.lower()
    return next((s for s in _KEPT_SUFFIXES if lower.endswith(s)), "")


def _stage(
    staging: Path,
    files: Iterable[tuple[str, BinaryIO]],
    max_bytes: int | None,
    modified_ns: Sequence[int] | None,
) -> tuple[list[str], int]:
    digests: list[str] = []
    total = 0
    for index, (name, stream) in enumerate(files):
        temp = staging / f".part-{index}"
        digest = hashlib.sha256()
        with open(temp, "wb") as out:
            while chunk := stream.read(_CHUNK):
                total += len(chunk)
                if max_bytes is not None and total > max_bytes:
                    raise UploadTooLargeError(
                        f"upload exceeds the limit of {max_bytes} bytes "
                        "(server.max_upload_bytes); send fewer or smaller files"
                    )
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            if modified_ns is not None:  # after the last write, before the fsync
                os.utime(out.fileno(), ns=(modified_ns[index], modified_ns[index]))
            os.fsync(out.fileno())
        hexdigest = digest.hexdigest()
        final = staging / f"{hexdigest}{_suffix(name)}"
        if final.exists():
            temp.unlink()  # the same bytes twice in one upload: one instance
        else:
            temp.rename(final)
        digests.extend(_content_digests(final, hexdigest))
    return digests, total


def _content_digests(stored: Path, digest: str) -> list[str]:
    """What a stored file adds to its study's fingerprint: its own digest, or an
    archive's members' (:func:`archive_member_digests`)."""
    if _suffix(stored.name) != ".zip":
        return [digest]
    with open(stored, "rb") as archive:
        return archive_member_digests(archive) or [digest]


def _move_into_place(staging: Path, target: Path) -> bool:
    """Rename the staged folder to ``target``; False if an identical study was there.

    A study already there is touched (its modification time is now): a folder set
    aside for a submission that got no job is deleted only when untouched for a while
    (radserve.service.unclaimed), and one deleted just now is stored again."""
    if target.is_dir():
        try:
            os.utime(target)
        except FileNotFoundError:
            pass  # swept a moment ago: this upload's copy takes its place
        except OSError:  # not ours to touch (EPERM): stored all the same
            return True
        else:
            return True
    created_parent = not target.parent.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(target)
    except OSError:
        if target.is_dir():  # a concurrent upload of the same study won the rename
            return True
        raise
    durable.fsync_dir(target.parent)
    if created_parent:  # studies/<ab>/ is new: its own entry (and studies/'s) must persist
        durable.fsync_dir(target.parent.parent)
        durable.fsync_dir(target.parent.parent.parent)
    return False


def _os_error(exc: OSError) -> str:
    """The error's errno name (``EROFS``, ``ENOSPC``, ...): never a path (paths may hold
    what a sender named a file)."""
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
