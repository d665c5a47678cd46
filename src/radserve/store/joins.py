"""A study submitted again while its first job is unfinished joins that job.

Two submissions of the same input (fingerprint, pipeline, models, precision) over the
same route, arriving together at one server or at two replicas sharing PostgreSQL, used
to make two jobs and two results. :meth:`Store.create_or_join` decides in the
transaction that would insert the job row: it takes a lock on the input first (SQLite:
the database write lock every write transaction takes at ``BEGIN IMMEDIATE``;
PostgreSQL: a transaction-scoped advisory lock keyed by the input), then looks for an
unfinished job of that input that :attr:`JoinRule.accepts` (the submitter may see it),
and inserts only when there is none. Of two such transactions the second waits for the
first to commit and then finds its job: two replicas cannot both pass.

The same lock answers two more cases (:class:`JoinMixin`): a submission that may not
make a job (its queue is full) takes the unfinished job or nothing
(:meth:`JoinMixin.join_unfinished`), and a result recorded after the submission looked
in the result cache (its job finished between the two reads) is found under the lock
(:attr:`JoinRule.results_seen`), so the submission goes back to the cache instead of
running the study a second time.

A more urgent duplicate of a job that waits on another replica raises the job's *row*
(:meth:`JoinMixin.refile_row`); the replica whose queue holds the job files it under
the row's class at its next look (:mod:`radserve.service.row_classes`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from radserve.audit.events import Action, job_event
from radserve.domain.priority import PriorityClass
from radserve.errors import quoted
from radserve.store import audit as audit_log
from radserve.store.base import StoreBase
from radserve.store.errors import JobNotFoundError
from radserve.store.jobs import UNFINISHED_STATES, jobs_of_input, to_record
from radserve.store.models import Job
from radserve.store.records import CacheKey, JobRecord, JobState, utc_now

_IDS_PER_QUERY = 500  # ids in one IN list (:meth:`JoinMixin.row_classes`)


@dataclass(frozen=True)
class JoinRule:
    """Which unfinished job a new submission joins instead of making its own: one of the
    same input (``key``) and route (``source``, the job's ``queue_meta["source"]``: what
    a route is sent differs), that ``accepts`` (e.g. the submitter may see it)."""

    key: CacheKey
    source: str
    accepts: Callable[[JobRecord], bool] = field(default=lambda job: True, compare=False)
    # added to the ``job.joined`` audit record (identifiers and classes only)
    audit_extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # how many succeeded jobs of the input there were before the submission looked in
    # the result cache (:meth:`JoinMixin.results_for`); more under the lock: a result
    # was recorded since, and that job is returned instead of a new one (None: not asked)
    results_seen: int | None = field(default=None, compare=False)


def lock_input(session: Session, key: CacheKey) -> None:
    """Serialise the submissions of ``key``'s input until the transaction ends. SQLite's
    write transactions hold the database's write lock from their BEGIN already."""
    if session.get_bind().dialect.name != "postgresql":
        return
    parts = (key.fingerprint, key.pipeline_name, key.pipeline_version, key.precision)
    text = "\x1f".join((*parts, key.model_versions_key))
    lock_id = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)
    session.execute(select(func.pg_advisory_xact_lock(lock_id)))


def joinable(session: Session, rule: JoinRule) -> JobRecord | None:
    """The oldest unfinished job that ``rule`` joins, or None (call under
    :func:`lock_input`)."""
    for row in jobs_of_input(session, rule.key, UNFINISHED_STATES):
        if (row.queue_meta or {}).get("source") != rule.source:
            continue
        record = to_record(row)
        if rule.accepts(record):
            return record
    return None


def answer(
    session: Session, rule: JoinRule, *, actor_key_id: str | None, client_address: str | None
) -> JobRecord | None:
    """What answers a submission under ``rule`` instead of a new job (call under
    :func:`lock_input`): the unfinished job it joins (audited ``job.joined``, naming the
    second submitter), else the newest succeeded job of the input when it was recorded
    after the submission's cache look-up (:attr:`JoinRule.results_seen`; not audited: the
    caller answers from the result cache), else None."""
    joined = joinable(session, rule)
    if joined is not None:
        event = job_event(
            Action.JOB_JOINED,
            joined,
            actor_key_id=actor_key_id,
            client_address=client_address,
            extra=dict(rule.audit_extra),
        )
        audit_log.append(session, event)
        return joined
    if rule.results_seen is None:
        return None
    results = jobs_of_input(session, rule.key, (JobState.SUCCEEDED,))
    if len(results) <= rule.results_seen:
        return None
    return to_record(results[-1])


class JoinMixin(StoreBase):
    """The duplicate submission's operations of :class:`radserve.store.Store` (the
    joining insert itself is :meth:`Store.create_or_join`)."""

    def results_for(self, key: CacheKey) -> int:
        """How many succeeded jobs ``key``'s input has (:attr:`JoinRule.results_seen`)."""
        with self._read() as session:
            return len(jobs_of_input(session, key, (JobState.SUCCEEDED,)))

    def accession_submitters(self, accession: str, pipeline_name: str) -> set[str | None]:
        """Who submitted the unfinished or succeeded jobs of ``pipeline_name`` that have
        ``accession`` on their row, or the unfinished ones with no number read yet (jobs
        from before revision 0020): the jobs an upload of that number may duplicate.
        Empty: none."""
        states = [s.value for s in (*UNFINISHED_STATES, JobState.SUCCEEDED)]
        unfinished = [s.value for s in UNFINISHED_STATES]
        with self._read() as session:
            rows = session.execute(
                select(Job.api_key_id)
                .where(
                    Job.pipeline_name == pipeline_name,
                    or_(
                        and_(Job.accession == accession, Job.state.in_(states)),
                        and_(Job.accession.is_(None), Job.state.in_(unfinished)),
                    ),
                )
                .distinct()
            ).all()
        return {row[0] for row in rows}

    def join_unfinished(
        self, rule: JoinRule, *, actor_key_id: str | None, client_address: str | None
    ) -> JobRecord | None:
        """:func:`answer` under the input's lock, creating nothing: for a submission that
        may not make a job of its own (its queue is full)."""
        with self._write() as session:
            lock_input(session, rule.key)
            return answer(session, rule, actor_key_id=actor_key_id, client_address=client_address)

    def refile_row(
        self,
        job_id: str,
        priority_class: PriorityClass,
        deadline: dt.datetime,
        *,
        when: Callable[[JobRecord], bool],
        actor_key_id: str | None,
        client_address: str | None,
        extra: Mapping[str, Any],
    ) -> JobRecord | None:
        """Write a job's new class and deadline, with a ``job.reprioritised`` audit
        record (who, ``extra``), if ``when`` holds for its row as read under a row lock;
        None (nothing written) when it does not. For a job whose queue is another
        replica's (or not joined yet): that replica follows its row
        (:mod:`radserve.service.row_classes`)."""
        with self._write() as session:
            row = session.execute(
                select(Job).where(Job.id == job_id).with_for_update()
            ).scalar_one_or_none()
            if row is None:
                raise JobNotFoundError(f"no job with id {quoted(job_id)}")
            if not when(to_record(row)):
                return None
            row.priority_class = PriorityClass(priority_class).value
            row.deadline = deadline
            row.updated = utc_now()
            session.flush()
            record = to_record(row)
            audit_log.append(
                session,
                job_event(
                    Action.JOB_REPRIORITISED,
                    record,
                    actor_key_id=actor_key_id,
                    client_address=client_address,
                    extra=extra,
                ),
            )
            return record

    def row_classes(self, job_ids: Collection[str]) -> dict[str, tuple[PriorityClass, JobState]]:
        """The class and state of each of ``job_ids`` as its row says (ids without a row
        are left out)."""
        ids = sorted(job_ids)
        found: dict[str, tuple[PriorityClass, JobState]] = {}
        with self._read() as session:
            for start in range(0, len(ids), _IDS_PER_QUERY):
                rows = session.execute(
                    select(Job.id, Job.priority_class, Job.state).where(
                        Job.id.in_(ids[start : start + _IDS_PER_QUERY])
                    )
                ).all()
                for job_id, cls, state in rows:
                    found[job_id] = (PriorityClass(cls), JobState(state))
        return found


__all__ = ["JoinMixin", "JoinRule", "answer", "joinable", "lock_input"]
