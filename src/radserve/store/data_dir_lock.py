"""One server on a SQLite store: ``radserve serve`` holds an exclusive lock on a file
beside the database for as long as it runs.

A server on a store that is not shared (SQLite, ``outbox.replicas`` 1) owns every
unfinished job: at start it claims them all (:meth:`radserve.store.leases.LeaseMixin.claim_jobs`
with ``shared=False``). A second ``radserve serve`` on the same data dir (a second
config, a systemd unit and a hand-started one) took the running server's jobs and ran
them again, while that server went on running them too; only the port check stopped
it, and only when both used one port. Now the second one refuses at once, naming the
data dir and the process that holds it.

The lock is ``flock(LOCK_EX)`` on ``<database>.lock`` (``radserve.db.lock`` in the data
dir): the kernel releases it when the process ends, however it ends (``kill -9``, a
crash), so a stale lock file never blocks a restart; the file is never removed (a
removal between another process's open and its lock would let two servers hold locks on
two files). It is opened close-on-exec, and the server's helper processes are spawned,
not forked, so none of them holds it after the server is gone. The holder writes its
process id, host and start time into the file; doctor reads them (``in use by pid N``).

Commands that only read (``keys list``, ``audit verify``, ``doctor``) and the key
commands take no lock: they work beside a running server, as before.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from radserve.store.errors import StoreError

LOCK_SUFFIX = ".lock"
# a doctor elsewhere may hold the lock for a moment (it tests whether a server holds
# it): a starting server tries again for this long before it refuses
ACQUIRE_WAIT_S = 1.0
_RETRY_S = 0.05


class DataDirInUseError(StoreError):
    """Another running ``radserve serve`` holds the SQLite store of this data dir."""

    code = "data_dir_in_use"
    retryable = False


@dataclass(frozen=True)
class Holder:
    """Who holds a store's lock, as the holder wrote it (None: not written yet)."""

    pid: int | None
    host: str | None
    since: str | None

    def describe(self) -> str:
        """``pid 1234 on this host, since ...`` (or what of it is known)."""
        if self.pid is None:
            return "a process whose id is not written yet"
        where = ""
        if self.host is not None:
            where = " on this host" if self.host == socket.gethostname() else f" on {self.host}"
        since = f", since {self.since}" if self.since else ""
        return f"pid {self.pid}{where}{since}"


def lock_path(database: Path) -> Path:
    """The lock file of the SQLite database file ``database``."""
    return database.with_name(database.name + LOCK_SUFFIX)


class ServeLock:
    """The held lock of one serving process; :meth:`release` (or the process's end)
    lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> ServeLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def acquire(database: Path, *, data_dir: Path, wait_s: float = ACQUIRE_WAIT_S) -> ServeLock:
    """Take the serving lock of the SQLite store ``database`` (of ``data_dir``, which the
    refusal names), or raise :class:`DataDirInUseError` naming the process that holds it,
    or :class:`StoreError` where the lock file cannot be made (a read-only data dir)."""
    path = lock_path(database.absolute())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a database outside the data dir
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(_cannot_create(path, exc)) from exc
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _read_holder(fd)
                os.close(fd)
                raise DataDirInUseError(_in_use(data_dir, database, holder)) from None
            time.sleep(_RETRY_S)
        except OSError as exc:  # a file system without locks
            os.close(fd)
            raise StoreError(f"cannot lock {path}: {exc.strerror}") from exc
    stamp = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(stamp) + "\n").encode(), 0)
    except OSError:  # the lock holds without it; doctor then says "not written yet"
        pass
    return ServeLock(path, fd)


def holder(database: Path) -> Holder | None:
    """Who holds the serving lock of the SQLite store ``database``; None if no process
    does (or there is no lock file). Creates nothing and works on a read-only data dir;
    the test holds a shared lock for an instant, which a starting server waits out
    (:data:`ACQUIRE_WAIT_S`)."""
    try:
        fd = os.open(lock_path(database.absolute()), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_holder(fd: int) -> Holder:
    try:
        stamp = json.loads(os.pread(fd, 4096, 0).decode())
    except (OSError, ValueError):
        return Holder(None, None, None)
    if not isinstance(stamp, dict):
        return Holder(None, None, None)
    pid = stamp.get("pid")
    host, since = stamp.get("host"), stamp.get("since")
    return Holder(
        pid if isinstance(pid, int) else None,
        host if isinstance(host, str) else None,
        since if isinstance(since, str) else None,
    )


def _in_use(data_dir: Path, database: Path, holder: Holder) -> str:
    where = f"the data dir {data_dir}"
    if database.absolute().parent != data_dir.absolute():
        where += f" (its database {database})"
    return (
        f"{where} is in use by another `radserve serve` ({holder.describe()}): on SQLite one "
        "server owns the store and its jobs, and a second one would take them over. Stop "
        "that server first, or start this one with another --data-dir (servers share jobs "
        "only through PostgreSQL)"
    )


def _cannot_create(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        why = "a read-only file system" if exc.errno == errno.EROFS else "no write permission"
        return (
            f"the data dir {path.parent} is read-only ({why}): `radserve serve` cannot "
            f"create its lock file {path.name} there, and it writes the store, studies and "
            "results in it; make the folder writable for this user"
        )
    return f"cannot create the lock file {path}: {exc.strerror or exc}"


__all__ = [
    "DataDirInUseError",
    "Holder",
    "ServeLock",
    "acquire",
    "holder",
    "lock_path",
]
