"""Scheduling errors: stable codes the API maps to HTTP once, at its edge.

``QueueFullError`` -> 503 with ``Retry-After``; ``ModelUnavailableError`` -> 503 (the
model's circuit breaker is open); the others are stored as a failed job's code.
"""

from __future__ import annotations

from radserve.errors import RadserveError


class SchedulingError(RadserveError):
    code = "scheduling_failed"


class QueueFullError(SchedulingError):
    """Admission refused: the class's queue is full. Retry after ``retry_after`` seconds."""

    code = "queue_full"
    retryable = True

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelUnavailableError(SchedulingError):
    """A model's circuit breaker is open: it failed repeatedly and takes no jobs until reset."""

    code = "model_unavailable"

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message)
        self.model = model


class DuplicateJobError(SchedulingError):
    code = "job_duplicate"


class JobTimeoutError(SchedulingError):
    code = "job_timeout"


class JobCancelledError(SchedulingError):
    code = "job_cancelled"


class NotWaitingError(SchedulingError):
    """Re-prioritising a job that is not waiting in the scheduler (started, finished,
    or not yet handed over by ingest): its class can no longer change where it runs."""

    code = "job_not_waiting"


__all__ = [
    "DuplicateJobError",
    "JobCancelledError",
    "JobTimeoutError",
    "ModelUnavailableError",
    "NotWaitingError",
    "QueueFullError",
    "SchedulingError",
]
