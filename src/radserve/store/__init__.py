"""Persistence: jobs, result cache, API keys and the audit chain (SQLite or PostgreSQL),
plus content-addressed study files (:mod:`radserve.store.files`).

Open it with :func:`init_store` (creates/upgrades the schema) and share the
:class:`Store` it returns.
"""

from radserve.store.errors import (
    ApiKeyNotFoundError,
    DatabaseUnavailableError,
    InvalidCursorError,
    InvalidTransitionError,
    JobNotFoundError,
    ResultAlreadyRecordedError,
    StoreError,
)
from radserve.store.leases import Claimed, Lease, LeaseLostError
from radserve.store.records import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    ApiKeyRecord,
    AuditRecord,
    CacheKey,
    JobPage,
    JobRecord,
    JobState,
    PriorityClass,
)
from radserve.store.store import UNFINISHED_STATES, Store, init_store

__all__ = [
    "ALLOWED_TRANSITIONS",
    "TERMINAL_STATES",
    "UNFINISHED_STATES",
    "ApiKeyNotFoundError",
    "ApiKeyRecord",
    "AuditRecord",
    "CacheKey",
    "Claimed",
    "DatabaseUnavailableError",
    "InvalidCursorError",
    "InvalidTransitionError",
    "JobNotFoundError",
    "JobPage",
    "JobRecord",
    "JobState",
    "Lease",
    "LeaseLostError",
    "PriorityClass",
    "ResultAlreadyRecordedError",
    "Store",
    "StoreError",
    "init_store",
]
