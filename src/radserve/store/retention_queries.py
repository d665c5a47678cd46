"""The store's side of retention (:mod:`radserve.service.retention`): which jobs name a
stored study, a result folder or a comparison folder, whether any of their deliveries
still waits, forgetting a removed result's index rows, and recording on its jobs that it
was removed (what their result endpoints then answer: 410, not 404).

Studies are looked up by fingerprint (a study folder's name) and results and comparisons
by job id (a result or comparison folder's name), never by path: a command given the
data folder spelled another way (relative, a symlink) finds the same rows, so a folder is
never taken for one no job names because its path was written differently.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from sqlalchemy import delete, or_, select

from radserve.store.base import StoreBase
from radserve.store.errors import JobNotFoundError
from radserve.store.models import CachedResult, Job, OutboxDelivery, ResultInstance
from radserve.store.records import TERMINAL_STATES, JobRecord

if TYPE_CHECKING:
    from radserve.store.store import Store

# a delivery in one of these may still read its file (radserve.store.models.OUTBOX_STATES)
UNSENT_STATES = ("pending", "sending", "held", "committing")
_CHUNK = 500  # values per IN (...) list: well under SQLite's and PostgreSQL's limits
_TERMINAL = frozenset(state.value for state in TERMINAL_STATES)


@dataclass(frozen=True)
class JobAge:
    """What retention needs of one job row."""

    id: str
    fingerprint: str
    cached_from: str | None
    final: bool
    # when it became final (``finished``, else its last update); None while unfinished
    ended: dt.datetime | None
    # the name of the result folder its row names (a cached answer: the earlier job's);
    # None without a result. A removed folder is recorded only on the jobs it served
    result_folder: str | None = None


def _chunks(values: Iterable[str]) -> Iterator[list[str]]:
    items = sorted(set(values))
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _age(row: Job) -> JobAge:
    final = row.state in _TERMINAL
    return JobAge(
        id=row.id,
        fingerprint=row.fingerprint,
        cached_from=row.cached_from,
        final=final,
        ended=(row.finished or row.updated) if final else None,
        result_folder=PurePath(row.result_path).name if row.result_path else None,
    )


_COLUMNS = (
    Job.id,
    Job.fingerprint,
    Job.cached_from,
    Job.state,
    Job.finished,
    Job.updated,
    Job.result_path,
)


def jobs_of_studies(store: StoreBase, folders: Sequence[Path]) -> dict[str, list[JobAge]]:
    """Study folder name (its fingerprint) -> every job of that input or naming that
    folder as its study (none: absent from the map)."""
    by_path = {str(folder): folder.name for folder in folders}
    found: dict[str, dict[str, JobAge]] = {}
    with store._read() as session:
        for chunk in _chunks(folder.name for folder in folders):
            names = set(chunk)
            paths = [path for path, name in by_path.items() if name in names]
            query = select(*_COLUMNS, Job.study_path).where(
                or_(Job.fingerprint.in_(chunk), Job.study_path.in_(paths))
            )
            for row in session.execute(query):
                age = _age(row)  # type: ignore[arg-type]
                for name in {row.fingerprint, by_path.get(row.study_path)} & names:
                    found.setdefault(str(name), {})[row.id] = age
    return {name: list(rows.values()) for name, rows in found.items()}


def jobs_of_results(store: StoreBase, job_ids: Sequence[str]) -> dict[str, list[JobAge]]:
    """Job id -> that job and every job answered from its result (``cached_from``: a
    cached answer serves the same folder); a job with no row is absent from the map."""
    found: dict[str, list[JobAge]] = {}
    copies: dict[str, list[JobAge]] = {}
    with store._read() as session:
        for chunk in _chunks(job_ids):
            ids = set(chunk)
            query = select(*_COLUMNS).where(or_(Job.id.in_(chunk), Job.cached_from.in_(chunk)))
            for row in session.execute(query):
                age = _age(row)  # type: ignore[arg-type]
                if age.id in ids:
                    found.setdefault(age.id, []).insert(0, age)
                if age.cached_from in ids:
                    copies.setdefault(str(age.cached_from), []).append(age)
    for owner, ages in copies.items():
        if owner in found:
            found[owner] += [age for age in ages if age.id != owner]
    return found


def jobs_by_id(store: StoreBase, job_ids: Sequence[str]) -> dict[str, JobAge]:
    """Job id -> that job's row alone (no row: absent), for a folder only that job uses:
    its comparison runs' (``comparisons/<job id>/``; a job answered from a cached result
    gets no comparison run, so its copies do not keep the folder)."""
    found: dict[str, JobAge] = {}
    with store._read() as session:
        for chunk in _chunks(job_ids):
            for row in session.execute(select(*_COLUMNS).where(Job.id.in_(chunk))):
                age = _age(row)  # type: ignore[arg-type]
                found[age.id] = age
    return found


def jobs_with_unsent(store: StoreBase, job_ids: Sequence[str]) -> set[str]:
    """The jobs among ``job_ids`` with a delivery not yet sent, failed or given up."""
    waiting: set[str] = set()
    with store._read() as session:
        for chunk in _chunks(job_ids):
            query = (
                select(OutboxDelivery.job_id)
                .where(OutboxDelivery.job_id.in_(chunk))
                .where(OutboxDelivery.state.in_(UNSENT_STATES))
                .distinct()
            )
            waiting |= {str(job_id) for job_id in session.execute(query).scalars()}
    return waiting


def forget_results(store: StoreBase, job_ids: Sequence[str]) -> tuple[int, int]:
    """Delete the result cache's entries and DICOMweb's index rows of ``job_ids``, whose
    result folders are about to go: a study sent again then runs again instead of being
    answered by a result that is gone, and WADO-RS / QIDO-RS no longer list its
    instances. The job rows and their delivery history stay. Idempotent (a second call,
    or another replica's, deletes nothing). Returns (cache rows, index rows) deleted."""
    cached = indexed = 0
    with store._write(audited=False) as session:
        for chunk in _chunks(job_ids):
            cached += session.execute(  # type: ignore[attr-defined]
                delete(CachedResult).where(CachedResult.job_id.in_(chunk))
            ).rowcount
            indexed += session.execute(  # type: ignore[attr-defined]
                delete(ResultInstance).where(ResultInstance.job_id.in_(chunk))
            ).rowcount
    return cached, indexed


def record_result_removed(
    store: Store, rows: Sequence[JobAge], folder: str, warning: Mapping[str, str]
) -> list[JobRecord]:
    """Record ``warning`` (the job view's ``result_removed`` warning,
    :func:`radserve.service.job_view.result_removed_warning`) on each job of ``rows``
    whose result is the folder named ``folder``, about to be deleted: its result
    endpoints then answer 410 naming the policy instead of a 404 that reads as if it
    never had a result, and ``GET /v1/jobs/{id}`` lists it. A leftover folder of another
    incarnation (``<job id>.<n>``) names no job's result and is recorded on none. Through
    :meth:`Store.add_job_warning` (one of the same code is replaced: idempotent), which
    bumps the row's ``updated``, so a cache keeping the newest record takes these.
    Returns the records written."""
    written = []
    for row in rows:
        if row.result_folder != folder:
            continue
        try:
            written.append(store.add_job_warning(row.id, warning))
        except JobNotFoundError:  # its row deleted meanwhile: nothing left to answer for
            continue
    return written


__all__ = [
    "UNSENT_STATES",
    "JobAge",
    "forget_results",
    "jobs_by_id",
    "jobs_of_results",
    "jobs_of_studies",
    "jobs_with_unsent",
    "record_result_removed",
]
