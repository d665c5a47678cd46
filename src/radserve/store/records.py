"""What the store hands out: frozen records, never live ORM objects bound to a session."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from radserve.audit.chain import AuditRecord
from radserve.domain.jobs import ALLOWED_TRANSITIONS, TERMINAL_STATES, JobState
from radserve.domain.priority import PriorityClass

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
    # the replica holding the job's lease (radserve.store.leases), None: no lease
    lease_owner: str | None = None
    # the study's Accession Number as stored on the row ('' none; None not read yet)
    accession: str | None = None

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
    site: str | None = None
    submitter: str | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None
