"""The record of an install that runs after its request was answered (``POST
/v1/models?build_variants=true``: building and gating variants takes minutes, longer
than an HTTP client or a proxy waits).

One JSON file per install in ``<data_dir>/models/.installs/``, written whole
(:func:`radserve.durable.write_json`) by the process that runs it and read by any
replica sharing the data dir, and beside it the checked bundle (``<id>.bundle/``) until
the install ends, so that an install a stop or a crash cut short is not lost: the next
server started on the data dir *claims* it and builds it again from the start
(:meth:`InstallTasks.claim`; a bundle whose build was cut short :data:`MAX_ATTEMPTS`
times is given up, as a study that crashes its worker would be). A record says which
process owns it: one a stopping server released (owner ``""``), or left ``queued`` or
``building`` by a process of this host that is gone, waits ``queued`` for the next
start; one without its bundle (written before bundles were kept, or given up) reads as
``interrupted``. A process of another host (replicas sharing the data dir) cannot be
asked whether it runs, so its process touches its unfinished records every
:data:`BEAT_S` (:meth:`InstallTasks.beat`), and a record of another host untouched for
:data:`LEASE_S` is left behind too (session 31: before, a replica host that died during
a build left its install ``building`` for ever, and no server built it again). The
newest :data:`KEPT` records are kept.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from radserve import durable
from radserve.lifecycle.install import models_root

TASKS_DIR = ".installs"
KEPT = 200
TASK_ID = re.compile(r"^[0-9a-f]{32}$")
BUNDLE_SUFFIX = ".bundle"
MAX_ATTEMPTS = 3  # builds cut short by a stop or a crash before the install is given up
RELEASED = ""  # the owner of a record a stopping server left for the next one
# an owner touches its unfinished records this often; one of another host untouched for
# LEASE_S is its dead process's (generous: the hosts' clocks and a shared file system's
# times may differ by minutes; durable.UNOWNED_IDLE_S is the same judgement for files)
BEAT_S = 60.0
LEASE_S = 10 * 60.0

State = Literal["queued", "building", "installed", "rejected", "failed", "interrupted"]
UNFINISHED: tuple[State, ...] = ("queued", "building")
INTERRUPTED_WHY = (
    "the server that ran this install stopped before it finished; nothing was installed: "
    "send the bundle again"
)
GIVEN_UP_WHY = (
    f"the server stopped during this build {MAX_ATTEMPTS} times (a crash while building?); "
    "nothing was installed and the build is not resumed again: send the bundle again"
)


def _now() -> str:
    """To the microsecond: records are listed in the order they were made."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class InstallTask:
    """One install's state; ``result`` once installed (name, version, files, variants),
    ``error`` (code, message) once refused or failed. ``client`` and ``build`` (the
    variant request's other fields) are what a resumed build needs; ``attempts``, how
    many builds of it have started."""

    id: str
    state: State
    created: str
    source: str
    actor: str | None = None
    precisions: list[str] | None = None
    owner: str = ""
    started: str | None = None
    finished: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    client: str | None = None
    build: dict[str, Any] | None = None
    attempts: int = 0
    # seconds since the record was last written or touched (its file's time), as read;
    # not stored
    idle_s: float = field(default=0.0, compare=False)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        for private in ("owner", "client", "build", "idle_s"):  # a host hash and a pid;
            del out[private]  # the client's address; the request's test settings
        return out

    @property
    def left_behind(self) -> bool:
        """Unfinished, and its owner released it, is a process of this host that is
        gone, or is of another host and has not touched it for :data:`LEASE_S`."""
        if self.state not in UNFINISHED:
            return False
        if self.owner == RELEASED:
            return True
        if durable.of_this_host(self.owner):
            return not durable.process_alive(self.owner)
        return self.idle_s > LEASE_S


def _read_raw(path: Path) -> InstallTask | None:
    try:
        idle = max(0.0, time.time() - path.stat().st_mtime)
        return InstallTask(**json.loads(path.read_text()), idle_s=idle)
    except (OSError, ValueError, TypeError):
        return None  # being replaced, or not a record this version wrote


def _bundle_of(record: Path) -> Path:
    """The checked bundle kept beside the record file ``record`` until the install ends."""
    return record.with_suffix(BUNDLE_SUFFIX)


def _read(path: Path) -> InstallTask | None:
    """The record as a client should see it: one left behind waits ``queued`` for the
    next server while its bundle is kept and attempts are left, else is interrupted."""
    task = _read_raw(path)
    if task is None or not task.left_behind:
        return task
    if task.attempts < MAX_ATTEMPTS and _bundle_of(path).is_dir():
        return replace(task, state="queued")
    why = GIVEN_UP_WHY if task.attempts >= MAX_ATTEMPTS else INTERRUPTED_WHY
    return replace(task, state="interrupted", error={"code": "interrupted", "message": why})


class InstallTasks:
    """The install records of one data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = models_root(data_dir) / TASKS_DIR

    def _path(self, task_id: str) -> Path:
        return self.folder / f"{task_id}.json"

    def bundle(self, task: InstallTask) -> Path:
        """The checked bundle kept for ``task`` until it ends."""
        return _bundle_of(self._path(task.id))

    def _write(self, task: InstallTask) -> InstallTask:
        task = replace(task, idle_s=0.0)
        stored = asdict(task)
        del stored["idle_s"]  # the file's time says it
        durable.write_json(self._path(task.id), stored)
        return task

    def beat(self, task_id: str) -> None:
        """Touch an unfinished record this process owns: it is still at work on it (a
        server of another host judges it by this, :data:`LEASE_S`)."""
        with contextlib.suppress(OSError):  # ended and pruned, or the folder away a moment
            os.utime(self._path(task_id))

    def create(
        self,
        bundle: Path,
        source: str,
        *,
        actor: str | None,
        precisions: list[str] | None,
        client: str | None = None,
        build: dict[str, Any] | None = None,
    ) -> InstallTask:
        """Record a new install (``queued``) and keep ``bundle`` (a checked bundle folder,
        moved here: same file system as the staging folder) beside it until it ends."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._prune()
        task = InstallTask(
            id=uuid.uuid4().hex,
            state="queued",
            created=_now(),
            source=source,
            actor=actor,
            precisions=precisions,
            owner=durable.process_tag(),
            client=client,
            build=build,
        )
        self._write(task)  # first: a process gone before the rename leaves an interrupted one
        try:
            os.rename(bundle, self.bundle(task))
            durable.fsync_dir(self.folder)
        except BaseException:
            self._path(task.id).unlink(missing_ok=True)
            raise
        return task

    def started(self, task: InstallTask) -> InstallTask:
        return self._write(
            replace(task, state="building", started=_now(), attempts=task.attempts + 1)
        )

    def installed(self, task: InstallTask, result: dict[str, Any]) -> InstallTask:
        done = self._write(replace(task, state="installed", finished=_now(), result=result))
        self._drop_bundle(task)
        return done

    def ended(self, task: InstallTask, state: State, code: str, message: str) -> InstallTask:
        """Record ``rejected`` (the bundle or what was built from it was refused),
        ``failed`` (radserve's own fault) or ``interrupted`` with the reason; the kept
        bundle goes."""
        error = {"code": code, "message": message}
        done = self._write(replace(task, state=state, finished=_now(), error=error))
        self._drop_bundle(task)
        return done

    def release(self, task: InstallTask) -> InstallTask:
        """A stopping server leaves ``task`` (not started, or cut short) to the next one."""
        return self._write(replace(task, state="queued", owner=RELEASED))

    def claim(self, task_id: str) -> InstallTask | None:
        """Take over an install left behind (:attr:`InstallTask.left_behind`) whose bundle
        is kept: the record becomes this process's, ``queued``. None when there is none to
        take, or another process took it first (the bundle's rename is the lock: of two
        servers starting at once, one moves it; the other finds it gone or, after it is
        back, the record owned by a running process). A task out of attempts is ended
        ``interrupted`` instead."""
        task = _read_raw(self._path(task_id))
        if task is None or not task.left_behind:
            return None
        bundle = self.bundle(task)
        held = bundle.with_name(f"{bundle.name}.{durable.process_tag()}")
        try:
            os.rename(bundle, held)
        except OSError:
            return None  # gone, or being claimed
        try:
            task = _read_raw(self._path(task_id))  # as it is now that the bundle is ours
            if task is None or not task.left_behind:
                return None
            if task.attempts >= MAX_ATTEMPTS:
                shutil.rmtree(held, ignore_errors=True)
                return self.ended(task, "interrupted", "interrupted", GIVEN_UP_WHY)
            return self._write(replace(task, state="queued", owner=durable.process_tag()))
        finally:
            if held.exists():
                os.rename(held, bundle)

    def claimable(self) -> list[InstallTask]:
        """Installs a next server may claim (left behind, their bundle kept), oldest
        first (they run in that order)."""
        tasks = [
            t
            for t in map(_read_raw, self._files())
            if t is not None and t.left_behind and self.bundle(t).is_dir()
        ]
        return sorted(tasks, key=lambda t: (t.created, t.id))

    def _drop_bundle(self, task: InstallTask) -> None:
        shutil.rmtree(self.bundle(task), ignore_errors=True)

    def get(self, task_id: str) -> InstallTask | None:
        if not TASK_ID.match(task_id):
            return None
        return _read(self._path(task_id))

    def recent(self, limit: int = 50) -> list[InstallTask]:
        """Newest first."""
        tasks = [t for t in map(_read, self._files()) if t is not None]
        tasks.sort(key=lambda t: (t.created, t.id), reverse=True)
        return tasks[:limit]

    def _files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return [p for p in self.folder.glob("*.json") if TASK_ID.match(p.stem)]

    def _prune(self) -> None:
        """Keep the newest records, never an unfinished one."""
        tasks = self.recent(limit=len(self._files()))
        for task in tasks[KEPT - 1 :]:
            if task.state not in UNFINISHED:
                self._drop_bundle(task)
                self._path(task.id).unlink(missing_ok=True)
