"""The record of an install that runs after its request was answered (``POST
/v1/models?build_variants=true``: building and gating variants takes minutes, longer
than an HTTP client or a proxy waits).

One JSON file per install in ``<data_dir>/models/.installs/``, written whole
(:func:`radserve.durable.write_json`) by the process that runs it and read by any
replica sharing the data dir. A record says which process owns it, so one left
``queued`` or ``building`` by a process that is gone reads as ``interrupted``: nothing was
installed (the staging folder is swept at the next start) and the bundle must be sent
again. The newest :data:`KEPT` records are kept.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from radserve import durable
from radserve.lifecycle.install import models_root

TASKS_DIR = ".installs"
KEPT = 200
TASK_ID = re.compile(r"^[0-9a-f]{32}$")

State = Literal["queued", "building", "installed", "rejected", "failed", "interrupted"]
UNFINISHED: tuple[State, ...] = ("queued", "building")
INTERRUPTED_WHY = (
    "the server that ran this install stopped before it finished; nothing was installed: "
    "send the bundle again"
)


def _now() -> str:
    """To the microsecond: records are listed in the order they were made."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class InstallTask:
    """One install's state; ``result`` once installed (name, version, files, variants),
    ``error`` (code, message) once refused or failed."""

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

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["owner"]  # a host hash and a pid: nothing a client acts on
        return out


def _read(path: Path) -> InstallTask | None:
    try:
        data = json.loads(path.read_text())
        task = InstallTask(**data)
    except (OSError, ValueError, TypeError):
        return None  # being replaced, or not a record this version wrote
    if task.state in UNFINISHED and not durable.process_alive(task.owner):
        return replace(
            task, state="interrupted", error={"code": "interrupted", "message": INTERRUPTED_WHY}
        )
    return task


class InstallTasks:
    """The install records of one data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = models_root(data_dir) / TASKS_DIR

    def _path(self, task_id: str) -> Path:
        return self.folder / f"{task_id}.json"

    def _write(self, task: InstallTask) -> InstallTask:
        durable.write_json(self._path(task.id), asdict(task))
        return task

    def create(
        self, source: str, *, actor: str | None, precisions: list[str] | None
    ) -> InstallTask:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._prune()
        return self._write(
            InstallTask(
                id=uuid.uuid4().hex,
                state="queued",
                created=_now(),
                source=source,
                actor=actor,
                precisions=precisions,
                owner=durable.process_tag(),
            )
        )

    def started(self, task: InstallTask) -> InstallTask:
        return self._write(replace(task, state="building", started=_now()))

    def installed(self, task: InstallTask, result: dict[str, Any]) -> InstallTask:
        return self._write(replace(task, state="installed", finished=_now(), result=result))

    def ended(self, task: InstallTask, state: State, code: str, message: str) -> InstallTask:
        """Record ``rejected`` (the bundle or what was built from it was refused) or
        ``failed`` (radserve's own fault) with the reason."""
        error = {"code": code, "message": message}
        return self._write(replace(task, state=state, finished=_now(), error=error))

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
                self._path(task.id).unlink(missing_ok=True)
