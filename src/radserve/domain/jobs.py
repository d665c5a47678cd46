"""The states of a job and the transitions between them: one definition for the store
(which persists them), the scheduler (which reports them) and the API (which serves the
value, e.g. ``"queued"``).

``received``: stored, not yet handed to the scheduler. The scheduler reports every state
but ``received``. RUNNING -> QUEUED is a retry or a restart re-queue; RUNNING ->
SUCCEEDED happens only through ``Store.record_result``, so a result is recorded once.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class JobState(StrEnum):
    RECEIVED = "received"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

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

__all__ = ["ALLOWED_TRANSITIONS", "TERMINAL_STATES", "JobState"]
