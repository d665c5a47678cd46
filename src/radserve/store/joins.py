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
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from radserve.store.jobs import UNFINISHED_STATES, jobs_of_input, to_record
from radserve.store.records import CacheKey, JobRecord


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


__all__ = ["JoinRule", "joinable", "lock_input"]
