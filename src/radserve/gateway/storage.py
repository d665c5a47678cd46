"""Received instances on disk, durable before the C-STORE success status goes out.

Layout under the SCP's data folder::

    incoming/<Study Instance UID>/<SOP Instance UID>.dcm    images, handed to intake
    quarantine/<Study Instance UID>/<SOP Instance UID>.dcm  other storage classes, kept aside

Folder and file names are UIDs checked to be digits and dots, so nothing a sender typed
(a patient name) ends up in a path. Each file is written to a private temporary name
(a C-STORE's spool file, already on this file system, is linked there instead of copied),
fsynced, then linked to its final name (a link fails if the name exists, so of two
concurrent copies of one instance exactly one is kept) and the folder is fsynced. A final
name therefore only ever names complete, durable bytes, and ``save`` returns (the C-STORE
success goes out) only after the link is durable too.

A temporary name says who writes it (``.<final>.<host>-<pid>-<start>-<nonce>.part``): a process
killed mid-write (a receiving process of ``gateway.receivers``, the whole server) leaves
it behind, and :meth:`InstanceStore.remove_partials` (at start, and when a dead receiving
process is replaced) deletes exactly those whose process is gone, never one a live
association is still writing (another receiving process, another SCP on the same folder).

Durability modes (``gateway.durability``):

* ``per_instance`` (default): the C-STORE handler's thread does write, fsync, link, folder fsync.
  Every instance costs two device cache flushes, whatever else is in flight.
* ``group``: handlers write their temporary files and hand them to one
  committer thread, which takes every instance waiting, makes their data durable, links
  them and fsyncs each folder once, then releases the handlers. Concurrent associations
  share flushes; a lone association waits for its own batch of one, as before.
  ``gateway.group_sync`` chooses how a batch's data is made durable: ``fsync`` (each
  file) or ``syncfs`` (one syncfs(2) of the file system: one flush for the batch, but it
  also writes back every other process's dirty data on that file system, so use it when
  the data folder has a file system of its own).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO, Literal

from radserve.batch_worker import BatchWorker
from radserve.durable import TEMPORARY_SUFFIX as PARTIAL_SUFFIX
from radserve.durable import fsync_dir as _fsync_dir
from radserve.durable import owner_alive as partial_owner_alive
from radserve.durable import temporary_path
from radserve.gateway.errors import InstanceRejectedError, OutOfResourcesError
from radserve.ingest import rules

logger = logging.getLogger(__name__)

INCOMING_DIR = "incoming"
QUARANTINE_DIR = "quarantine"
INSTANCE_SUFFIX = ".dcm"
_CHUNK = 1 << 20
_FILE_MODE = 0o644


class Disposition(StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"  # same SOP Instance UID already on disk: kept as it was
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class StoredInstance:
    study_instance_uid: str
    sop_instance_uid: str
    sop_class_uid: str
    path: Path
    disposition: Disposition


def check_uid(value: object, what: str) -> str:
    """A UID safe to use as a file name; :class:`InstanceRejectedError` otherwise."""
    problem = rules.uid_problem(value, what)
    if problem is not None:
        raise InstanceRejectedError(problem)
    return str(value).strip().rstrip("\x00")


# what ``save`` takes: the file's bytes, a file holding them (a C-STORE's spool file), or a
# seekable stream of them (a STOW-RS part, read from its start in chunks, never whole)
Encoded = bytes | Path | BinaryIO

Durability = Literal["per_instance", "group"]
GroupSync = Literal["fsync", "syncfs"]


class InstanceStore:
    """Writes received instances; thread-safe (one call per C-STORE, many associations).

    ``on_durable`` (tests, instrumentation) is called by the committer with the final
    paths of each batch once they are durable, before any of its ``save`` calls return.
    Call :meth:`close` to stop the committer thread (``group`` mode).
    """

    def __init__(
        self,
        root: Path,
        *,
        min_free_bytes: int = 0,
        durability: Durability = "per_instance",
        group_sync: GroupSync = "fsync",
        on_durable: Callable[[list[Path]], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.incoming = self.root / INCOMING_DIR
        self.quarantine = self.root / QUARANTINE_DIR
        self.min_free_bytes = min_free_bytes
        self.durability = durability
        for folder in (self.incoming, self.quarantine):
            folder.mkdir(parents=True, exist_ok=True)
        if durability not in ("per_instance", "group"):
            raise ValueError(f"unknown durability mode {durability!r}")
        if group_sync == "syncfs" and _syncfs is None:
            raise ValueError("gateway.group_sync syncfs needs Linux's syncfs(2)")
        self.group_sync = group_sync
        self._on_durable = on_durable
        self._committer: GroupCommitter | None = None
        self._committer_lock = threading.Lock()

    @property
    def committer(self) -> GroupCommitter | None:
        """The running committer (``group`` mode, started by the first save)."""
        return self._committer

    def close(self) -> None:
        """Stop the committer after the batch in progress (a later save starts another)."""
        with self._committer_lock:
            committer, self._committer = self._committer, None
        if committer is not None:
            committer.close()

    def _group(self) -> GroupCommitter | None:
        if self.durability != "group":
            return None
        with self._committer_lock:
            if self._committer is None:
                self._committer = GroupCommitter(
                    self.root, sync=self.group_sync, on_durable=self._on_durable
                )
            return self._committer

    def study_dir(self, study_instance_uid: str, *, quarantine: bool = False) -> Path:
        base = self.quarantine if quarantine else self.incoming
        return base / check_uid(study_instance_uid, "Study Instance UID")

    def save(
        self,
        encoded: Encoded,
        *,
        study_instance_uid: str,
        sop_instance_uid: str,
        sop_class_uid: str,
        quarantine: bool = False,
    ) -> StoredInstance:
        """Make ``encoded`` (a DICOM file: preamble, meta, dataset; its bytes, a file
        holding them, or a seekable stream of them) durable. A file is handed over: linked
        where the file system allows (so the caller must not write to it afterwards;
        removing its name is fine), else copied in chunks; a stream is copied in chunks
        from its start. So an instance of any size costs no memory: a STOW-RS part filed
        for the quiet period was read whole into memory (a 2 GiB part, 2 GiB).

        Raises :class:`OutOfResourcesError` when it cannot (disk full, I/O error): the
        caller must then answer a failure, never success.
        """
        folder = self.study_dir(study_instance_uid, quarantine=quarantine)
        sop_uid = check_uid(sop_instance_uid, "SOP Instance UID")
        target = folder / f"{sop_uid}{INSTANCE_SUFFIX}"
        stored = StoredInstance(
            study_instance_uid=folder.name,
            sop_instance_uid=sop_uid,
            sop_class_uid=sop_class_uid,
            path=target,
            disposition=Disposition.QUARANTINED if quarantine else Disposition.STORED,
        )
        if target.exists():
            if _same_bytes(target, encoded):
                return _duplicate(stored)
            # One SOP Instance UID, other bytes: kept beside the first under a name of its
            # content, so ingest sees both and names the conflict, as at the form and
            # `radserve run` (a copy in another transfer syntax is dropped there).
            target = folder / f"{sop_uid}.{_digest(encoded)}{INSTANCE_SUFFIX}"
            stored = replace(stored, path=target)
            if target.exists():
                return _duplicate(stored)
            logger.warning(
                "instance %s received again with other content: kept both copies",
                sop_uid,
            )
        try:
            self._check_space(_size(encoded))
            self._make_folder(folder)
            committer = self._group()
            if committer is not None:
                written = committer.commit(folder, target, encoded)
            else:
                written = _write_new(folder, target, encoded)
                if written and self._on_durable is not None:
                    self._on_durable([target])
            if not written:  # another writer got there first: its bytes, or others?
                if stored.path.name != f"{sop_uid}{INSTANCE_SUFFIX}" or _same_bytes(
                    target, encoded
                ):
                    return _duplicate(stored)
                return self.save(
                    encoded,
                    study_instance_uid=study_instance_uid,
                    sop_instance_uid=sop_uid,
                    sop_class_uid=sop_class_uid,
                    quarantine=quarantine,
                )
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            logger.error("instance %s not stored: %s", sop_uid, reason)
            raise OutOfResourcesError(f"cannot store the instance: {reason}") from exc
        return stored

    def remove_partials(self) -> int:
        """Delete the temporary files of writers that died mid-write (never
        acknowledged): those of a process of this host that no longer runs, and those
        without an owner in their name (written before names had one). A live
        process's (another receiving process's association) and another host's are
        left alone. Returns how many were deleted."""
        removed = 0
        for partial in self.root.glob(f"*/*/.*{PARTIAL_SUFFIX}"):
            if partial_owner_alive(partial):
                continue
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
                removed += 1
        if removed:
            logger.info("removed %d partial instance file(s) of stopped writers", removed)
        return removed

    def _make_folder(self, folder: Path) -> None:
        if folder.is_dir():
            return
        folder.mkdir(parents=True, exist_ok=True)
        _fsync_dir(folder.parent)

    def _check_space(self, size: int) -> None:
        if self.min_free_bytes <= 0:
            return
        free = shutil.disk_usage(self.root).free
        if free - size < self.min_free_bytes:
            raise OSError(errno.ENOSPC, "free space below the configured reserve")


def partial_path(folder: Path, target: Path, *, pid: int | None = None) -> Path:
    """A new temporary name for ``target`` in ``folder``, owned by ``pid`` (this process)."""
    return temporary_path(folder / target.name, pid=pid)


def _size(encoded: Encoded) -> int:
    if isinstance(encoded, Path):
        return encoded.stat().st_size
    if isinstance(encoded, bytes):
        return len(encoded)
    return encoded.seek(0, os.SEEK_END)


def _write_all(descriptor: int, encoded: Encoded) -> None:
    """``encoded`` (bytes, or the file at that path or the stream, in 1 MiB chunks) to
    ``descriptor``."""
    for chunk in _chunks(encoded):
        view = memoryview(chunk)
        while view:
            view = view[os.write(descriptor, view) :]


# link(2) cannot give the file a second name here: another file system, or one without
# hard links; the bytes are copied instead
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.ENOSYS})


def _place(encoded: Encoded, temporary: Path) -> int:
    """``encoded`` under the new name ``temporary``; returns a descriptor of it (to fsync,
    then close); on failure nothing is left under that name. A file on this file system
    (the C-STORE spool file under the data folder) is linked, not copied: its bytes were
    written once, as they arrived (~0.3 CPU-ms and a second 0.5 MB in the page cache
    less per instance). Anything else is copied."""
    linked = False
    if isinstance(encoded, Path):
        try:
            os.link(encoded, temporary)
            linked = True
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
    try:
        if linked:
            descriptor = os.open(temporary, os.O_RDONLY)
        else:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    except BaseException:
        if linked:
            temporary.unlink()
        raise
    try:
        if linked:
            os.fchmod(descriptor, _FILE_MODE)  # pynetdicom's spool files are private (0600)
        else:
            _write_all(descriptor, encoded)
    except BaseException:
        os.close(descriptor)
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return descriptor


def _write_new(folder: Path, target: Path, encoded: Encoded) -> bool:
    """Place, fsync, link into place; False if another writer got there first."""
    temporary = partial_path(folder, target)
    try:
        descriptor = _place(encoded, temporary)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, target)
        except FileExistsError:
            return False
        _fsync_dir(folder)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


@dataclass(eq=False)
class _Pending:
    """One instance written to its temporary file, waiting for its batch to commit."""

    folder: Path
    target: Path
    temporary: Path
    descriptor: int
    done: threading.Event = field(default_factory=threading.Event)
    linked: bool = False
    error: OSError | None = None


class GroupCommitter:
    """One thread that makes waiting instances durable together (group commit).

    ``commit`` writes the bytes to a temporary file on the caller's thread (no flush),
    queues it and blocks until the committer has, for the whole batch: made every file's
    data durable (fsync each, or one syncfs), linked each to its final name, fsynced each
    folder once. Only then does ``commit`` return, so a C-STORE success is never sent for
    bytes a power cut could lose, and a final name never names bytes that are not durable.
    """

    def __init__(
        self,
        root: Path,
        *,
        sync: GroupSync = "fsync",
        on_durable: Callable[[list[Path]], None] | None = None,
    ) -> None:
        if sync == "syncfs" and _syncfs is None:
            raise ValueError("gateway.group_sync syncfs needs Linux's syncfs(2)")
        if sync not in ("fsync", "syncfs"):
            raise ValueError(f"unknown group_sync {sync!r}")
        self.sync = sync
        self.on_durable = on_durable
        self.batches = 0  # committed batches (the bench reports instances per batch)
        self.committed = 0
        self.largest_batch = 0
        self.busy_s = 0.0  # time spent committing (the bench reports the busy share)
        self._root = root
        self._worker: BatchWorker[_Pending] = BatchWorker(self._round, name="radserve-commit")

    def commit(self, folder: Path, target: Path, encoded: Encoded) -> bool:
        """Durably store ``encoded`` as ``target``; False if that name already existed."""
        temporary = partial_path(folder, target)
        descriptor = _place(encoded, temporary)
        pending = _Pending(folder, target, temporary, descriptor)
        try:
            if not self._worker.put(pending):
                raise OSError(errno.ESHUTDOWN, "the instance store is closed")
        except BaseException:
            os.close(descriptor)
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            raise
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.linked

    def close(self) -> None:
        self._worker.close(30)

    def _round(self, batch: list[_Pending]) -> None:
        start = time.perf_counter()
        self._commit(batch)
        self.busy_s += time.perf_counter() - start
        self.largest_batch = max(self.largest_batch, len(batch))

    def _commit(self, batch: list[_Pending]) -> None:
        try:
            self._make_durable(batch)
            folders: dict[Path, list[_Pending]] = {}
            for item in batch:
                if item.error is None:
                    try:
                        os.link(item.temporary, item.target)
                        item.linked = True
                        folders.setdefault(item.folder, []).append(item)
                    except FileExistsError:
                        pass  # another copy of this instance got there first
                    except OSError as exc:
                        item.error = exc
            for folder, items in folders.items():
                try:
                    _fsync_dir(folder)
                except OSError as exc:
                    for item in items:
                        item.error = exc
            durable = [item.target for item in batch if item.linked and item.error is None]
            self.batches += 1
            self.committed += len(durable)
            if durable and self.on_durable is not None:
                self.on_durable(durable)
        except BaseException as exc:  # never leave a handler waiting
            for item in batch:
                if item.error is None:
                    item.error = OSError(errno.EIO, f"commit failed: {type(exc).__name__}")
        finally:
            for item in batch:
                with contextlib.suppress(OSError):
                    os.close(item.descriptor)
                with contextlib.suppress(FileNotFoundError):
                    item.temporary.unlink()
                item.done.set()

    def _make_durable(self, batch: list[_Pending]) -> None:
        if self.sync == "syncfs" and _syncfs is not None:
            try:
                _syncfs(batch[0].descriptor)
                return
            except OSError as exc:
                for item in batch:
                    item.error = exc
                return
        for item in batch:
            try:
                os.fsync(item.descriptor)
            except OSError as exc:
                item.error = exc


def _load_syncfs() -> Callable[[int], None] | None:
    """syncfs(2) through libc (Python has no binding); None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int

    def syncfs(descriptor: int) -> None:
        if function(descriptor) != 0:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number))

    return syncfs


_syncfs = _load_syncfs()


def _chunks(encoded: Encoded) -> Iterator[bytes]:
    """``encoded``'s bytes: the bytes themselves, or the file's or the stream's (from its
    start) in chunks of at most 1 MiB."""
    if isinstance(encoded, bytes):
        yield encoded
        return
    with contextlib.ExitStack() as stack:
        if isinstance(encoded, Path):
            fh = stack.enter_context(open(encoded, "rb"))
        else:
            fh = encoded
            fh.seek(0)
        while chunk := fh.read(_CHUNK):
            yield chunk


def _same_bytes(stored: Path, encoded: Encoded) -> bool:
    """Whether ``encoded`` is byte for byte the file already stored (read in chunks)."""
    try:
        if stored.stat().st_size != _size(encoded):
            return False
        with open(stored, "rb") as fh:
            for chunk in _chunks(encoded):
                for at in range(0, len(chunk), _CHUNK):
                    piece = chunk[at : at + _CHUNK]
                    if fh.read(len(piece)) != piece:
                        return False
    except OSError:
        return False
    return True


def _digest(encoded: Encoded) -> str:
    digest = hashlib.sha256()
    for chunk in _chunks(encoded):
        digest.update(chunk)
    return digest.hexdigest()[:16]


def _duplicate(stored: StoredInstance) -> StoredInstance:
    logger.info("instance %s received again: kept the stored copy", stored.sop_instance_uid)
    return StoredInstance(
        study_instance_uid=stored.study_instance_uid,
        sop_instance_uid=stored.sop_instance_uid,
        sop_class_uid=stored.sop_class_uid,
        path=stored.path,
        disposition=Disposition.DUPLICATE,
    )


def study_instances(folder: Path) -> list[Path]:
    """The instance files of one study folder (temporary files excluded), sorted."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.suffix == INSTANCE_SUFFIX and not path.name.startswith(".")
    )
