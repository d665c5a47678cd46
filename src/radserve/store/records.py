"""What the store hands out: frozen records, never live ORM objects bound to a session."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from radserve.audit.chain import AuditRecord
from radserve.config import PriorityClass

__all__ = [
    "ALLOWED_TRANSITIONS",
    "TERMINAL_STATES",
    "ApiKeyRecord",
    "AuditRecord",
    "CacheKey",
    "JobPage",
    "JobRecord",
    "JobState",
    "PriorityClass",
    "utc_now",
]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class JobState(StrEnum):
    RECEIVED = "received"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# The job state machine. RUNNING -> QUEUED is a retry or a restart re-queue; RUNNING ->
# SUCCEEDED happens only through Store.record_result, so a result is recorded exactly once.
ALLOWED_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.RECEIVED: frozenset({JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset(
        {JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


@dataclass(frozen=True)
class CacheKey:
    """What makes two results interchangeable: same input, same pipeline, same models."""

    fingerprint: str
    pipeline_name: str
    pipeline_version: str
    model_versions: Mapping[str, str]
    precision: str

    @property
    def model_versions_key(self) -> str:
        """Canonical text of the model versions (sorted JSON), the column the key is on."""
        return json.dumps(dict(self.model_versions), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class JobRecord:
    """One study through one pipeline, as persisted."""

    id: str
    state: JobState
    priority_class: PriorityClass
    arrival: dt.datetime
    deadline: dt.datetime
    pipeline_name: str
    pipeline_version: str
    precision: str
    fingerprint: str
    study_path: str
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    updated: dt.datetime | None = None
    model_versions: Mapping[str, str] = field(default_factory=dict)
    result_path: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    attempts: int = 0
    cached_from: str | None = None
    api_key_id: str | None = None
    client_address: str | None = None
    stage_timings: Mapping[str, float] = field(default_factory=dict)
    queue_meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class JobPage:
    """One page of :meth:`Store.list_jobs`; pass ``next_cursor`` back for the next page."""

    items: list[JobRecord]
    next_cursor: str | None


@dataclass(frozen=True)
class ApiKeyRecord:
    """An API key without its secret (the store keeps only a keyed hash)."""

    id: str
    name: str
    role: str
    created: dt.datetime
    revoked: dt.datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None
