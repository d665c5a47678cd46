"""The scheduler's public vocabulary: requests, tickets, events and the hooks protocol.

The service implements :class:`JobHooks` to persist job states, count metrics and log;
the scheduler calls the hooks outside its lock, in the order the events happened.
Times are readings of the scheduler's clock (monotonic seconds).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from radserve.domain.jobs import JobState
from radserve.domain.priority import PriorityClass
from radserve.scheduling.work import JobWork, ModelKey

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobRequest:
    """One job to schedule.

    ``priority`` wins when given; else the configured rules classify ``attributes``
    (DICOM keyword -> value). ``age_s`` says how long ago the job really arrived and
    ``resume`` that it was admitted before a restart (it is then never refused), so a
    resubmitted job keeps its original deadline. ``deadline_in_s``: the job's deadline
    already decided elsewhere (the job row's), as seconds from now; the scheduler then
    keeps it instead of counting its own (arrival + the class's TAT), so its deadline
    misses and risk events are decided on the deadline the job API shows, not one tens
    of ms later (the row is written before the job enters the scheduler).
    """

    job_id: str
    work: JobWork
    priority: PriorityClass | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    age_s: float = 0.0
    resume: bool = False
    deadline_in_s: float | None = None


@dataclass(frozen=True)
class JobTicket:
    """What ``submit`` answers: the class chosen, the deadline, the place in the queue."""

    job_id: str
    cls: PriorityClass
    deadline: float
    position: int  # among waiting jobs, 0 = next to start


@dataclass(frozen=True)
class Reprioritised:
    """What ``reprioritise`` did: the class and deadline before and after (scheduler
    clock seconds) and the job's new place among the waiting jobs."""

    job_id: str
    old_cls: PriorityClass
    new_cls: PriorityClass
    old_deadline: float
    deadline: float
    position: int


@dataclass(frozen=True)
class JobEvent:
    """A state change. Terminal events carry stage timings (seconds), and the error code
    and message (failed, cancelled) or the work's result (succeeded)."""

    job_id: str
    state: JobState
    cls: PriorityClass
    at: float
    deadline: float
    timings: Mapping[str, float] = field(default_factory=dict)
    error_code: str | None = None
    error_message: str | None = None
    retries: int = 0
    result: object = None


@dataclass(frozen=True)
class DeadlineMiss:
    job_id: str
    cls: PriorityClass
    deadline: float
    detected_at: float

    @property
    def late_by(self) -> float:
        return self.detected_at - self.deadline


@dataclass(frozen=True)
class BatchEvent:
    """One device call: for batch-size and latency metrics."""

    device: str
    model: ModelKey
    items: int
    jobs: int
    seconds: float
    ok: bool


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: JobState
    cls: PriorityClass
    effective: PriorityClass  # after aging
    deadline: float
    slack_s: float
    position: int | None  # among waiting jobs; None once started
    missed: bool
    retries: int


@dataclass(frozen=True)
class QueuedJob:
    """One unfinished job in the scheduler's order (for ETAs: radserve.turnaround)."""

    job_id: str
    cls: PriorityClass
    effective: PriorityClass  # after aging
    running: bool  # started (its first unit was dispatched)
    arrival: float
    deadline: float
    started: float | None
    promoted: bool  # runs ahead of the rest of its class (deadline-risk policy)
    # a started job's stage timings so far (ScheduledJob.timings): how far it has got
    timings: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Hold:
    """Why the scheduler hands out no new unit (:meth:`Scheduler.hold`), and since when:
    a held scheduler looks idle from outside, so /metrics and /readyz say so."""

    reason: str  # a stable code, the metric's label (e.g. ``lease_unproven``)
    message: str  # what holds the work and what ends the hold (/readyz, the log)
    since: float  # the scheduler's clock


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Queue depths per class, waiting positions, misses, open breakers and the hold
    (/metrics, /readyz)."""

    at: float
    queued: Mapping[PriorityClass, int]
    running: Mapping[PriorityClass, int]
    positions: Mapping[str, int]
    deadline_misses: Mapping[PriorityClass, int]
    open_models: tuple[str, ...]
    prepared_batches: int
    held: Hold | None = None

    @property
    def held_s(self) -> float:
        """How long new work has been held (0 when it is not)."""
        return 0.0 if self.held is None else max(0.0, self.at - self.held.since)


class JobHooks(Protocol):
    """Where the service learns what happened. Exceptions are logged, never propagated."""

    def on_state(self, event: JobEvent) -> None: ...

    def on_deadline_miss(self, miss: DeadlineMiss) -> None: ...

    def on_batch(self, event: BatchEvent) -> None: ...


class NullHooks:
    def on_state(self, event: JobEvent) -> None:
        pass

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        pass

    def on_batch(self, event: BatchEvent) -> None:
        pass


__all__ = [
    "BatchEvent",
    "DeadlineMiss",
    "Hold",
    "JobEvent",
    "JobHooks",
    "JobInfo",
    "JobRequest",
    "JobState",
    "JobTicket",
    "NullHooks",
    "QueuedJob",
    "Reprioritised",
    "SchedulerSnapshot",
]
