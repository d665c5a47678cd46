"""Data folders and job rows for the retention tests (radserve.service.retention): stored
studies, finished jobs with a result folder, and a sweep whose clock is moved forward
instead of ageing rows (folders and rows are as new as the test made them, and a pass
"eight days later" sees them eight days old)."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radserve.config import StorageSettings
from radserve.service.retention import AUDIT_ACTION, Retention
from radserve.store import CacheKey, JobRecord, JobState, Store
from radserve.store.files import StoredStudy, store_study_files

DAY = 86_400.0


def later(days: float) -> Callable[[], float]:
    """A clock ``days`` ahead of the host's."""
    return lambda: time.time() + days * DAY


def at(days: float) -> Callable[[], float]:
    """A clock stopped ``days`` from now: every reading is the same instant (a date
    derived from it does not change at midnight during the test)."""
    fixed = time.time() + days * DAY
    return lambda: fixed


def stored_study(data_dir: Path, folder: Path, seed: int, files: int = 3) -> StoredStudy:
    """``files`` small distinct files stored as a study of ``data_dir``."""
    folder.mkdir(parents=True)
    paths = []
    for i in range(files):
        path = folder / f"{i}.dcm"
        path.write_bytes(os.urandom(64) + bytes([seed, i]) * 512)
        paths.append(path)
    return store_study_files(data_dir, paths)


def new_job(store: Store, stored: StoredStudy, **fields: Any) -> str:
    """A received job of ``stored``; its id."""
    return store.create_job(
        priority_class="OUTPATIENT",
        deadline=dt.timedelta(hours=1),
        pipeline_name="test-pipeline",
        pipeline_version="1",
        precision="fp32",
        fingerprint=stored.fingerprint,
        study_path=str(stored.path),
        **fields,
    ).id


def succeed(store: Store, job_id: str, result: Path, stored: StoredStudy) -> None:
    """Run ``job_id`` to succeeded with a small result folder at ``result`` (cached)."""
    store.transition(job_id, JobState.QUEUED)
    store.transition(job_id, JobState.RUNNING)
    result.mkdir(parents=True)
    (result / "report.json").write_text("{}")
    (result / "sr.dcm").write_bytes(b"\0" * 4096)
    key = CacheKey(stored.fingerprint, "test-pipeline", "1", {}, "fp32")
    store.record_result(job_id, str(result), key)


def sweeper(
    data_dir: Path,
    store: Store,
    days: float = 8,
    *,
    clock: Callable[[], float] | None = None,
    on_result_removed: Callable[[JobRecord], None] | None = None,
    **settings: Any,
) -> Retention:
    """The retention policy of ``data_dir`` (``settings``: ``storage.*``) as it stands
    ``days`` from now (or at ``clock``)."""
    # passed only when given: the same tests run against a Retention without it
    told = {} if on_result_removed is None else {"on_result_removed": on_result_removed}
    storage = StorageSettings(**settings)
    return Retention(data_dir, storage, store, clock=clock or later(days), **told)


def retention_audits(store: Store) -> list[dict[str, Any]]:
    """The payloads of the ``retention.swept`` audit records."""
    return [dict(r.payload) for r in store.iter_audit() if r.action == AUDIT_ACTION]


def age(path: Path, days: float) -> None:
    """Set the modification time of ``path`` ``days`` from now (negative: ago)."""
    when = time.time() + days * DAY
    os.utime(path, (when, when))
