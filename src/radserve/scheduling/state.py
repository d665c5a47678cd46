"""The scheduler's private bookkeeping for one job, and the ranking rule.

Rank = (effective class, aged-into-URGENT, not promoted, deadline, arrival order): highest
class first, then a job promoted for deadline risk, then earliest deadline. A routine job
is *aged* one class up once its slack (deadline - now) drops below ``aging_fraction`` of
its TAT, so it then competes by deadline with the class above and cannot starve. A job
aged into the URGENT class still ranks behind every genuine URGENT job: aging never makes
an emergency wait.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from radserve.config import SchedulerSettings
from radserve.domain.jobs import JobState
from radserve.domain.priority import PriorityClass
from radserve.inference.tasks import Batch
from radserve.scheduling.work import CpuStage, DeviceStage, JobWork

Rank = tuple[int, bool, bool, float, int]


def effective_class(
    cls: PriorityClass, deadline: float, now: float, config: SchedulerSettings
) -> PriorityClass:
    """``cls``, or one class higher when the job is close to (or past) its deadline."""
    if cls is PriorityClass.URGENT:
        return cls
    if deadline - now < config.aging_fraction * config.tat(cls):
        return cls.promoted()
    return cls


@dataclass(frozen=True, eq=False)
class ReadyBatch:
    """A prepared batch waiting for a device, and since when."""

    batch: Batch
    since: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.batch.inputs.shape[1:])

    @property
    def items(self) -> int:
        return int(self.batch.inputs.shape[0])


@dataclass(eq=False)
class StepProgress:
    """Where a device stage stands: prepared, on a device, waiting to merge, merged."""

    stage: DeviceStage
    total: int
    prepared: int = 0
    preparing: bool = False
    ready: deque[ReadyBatch] = field(default_factory=deque)
    on_device: int = 0
    to_merge: deque[tuple[Batch, np.ndarray]] = field(default_factory=deque)
    merging: bool = False
    merged: int = 0
    exhausted: bool = False

    @property
    def finished(self) -> bool:
        return (
            self.exhausted
            and not self.preparing
            and not self.merging
            and not self.ready
            and not self.to_merge
            and self.on_device == 0
            and self.merged >= self.prepared
        )


@dataclass(eq=False)
class ScheduledJob:
    """The scheduler's live view of one unfinished job (the persisted row is
    ``radserve.store.models.Job``, what the store hands out ``JobRecord``)."""

    id: str
    cls: PriorityClass
    work: JobWork
    arrival: float
    deadline: float
    seq: int
    state: JobState = JobState.QUEUED
    started: float | None = None
    stage: CpuStage | None = None
    stage_busy: bool = False
    step: StepProgress | None = None
    inflight: int = 0  # dispatches of this job being executed
    retries: int = 0
    not_before: float = float("-inf")  # backing off after a retryable failure until then
    missed: bool = False
    # run ahead of the other jobs of its effective class (the deadline-risk policy)
    promoted: bool = False
    # Set when the job must end (done, failed, cancelled, timed out); the terminal state
    # is published once nothing of it is in flight: the next batch boundary.
    stopping: tuple[JobState, str | None, str | None] | None = None
    # per stage, and ``paused``: seconds its routine CPU units spent paused at checkpoints
    # while URGENT work ran (inside the stage timings)
    timings: dict[str, float] = field(default_factory=dict)
    # the models whose device stage it has reached (run or skipped): once all of
    # ``work.models`` have and no step is open, only CPU stages are left (its tail)
    devices_reached: set[str] = field(default_factory=set)

    def add_time(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def effective(self, now: float, config: SchedulerSettings) -> PriorityClass:
        return effective_class(self.cls, self.deadline, now, config)

    def rank(self, now: float, config: SchedulerSettings) -> Rank:
        eff = self.effective(now, config)
        aged_urgent = eff is PriorityClass.URGENT and self.cls is not PriorityClass.URGENT
        return (eff.rank, aged_urgent, not self.promoted, self.deadline, self.seq)

    @property
    def active(self) -> bool:
        """Neither finished nor on its way out."""
        return self.stopping is None

    @property
    def in_tail(self) -> bool:
        """Started, with no device work left: only CPU stages (the last model's
        post-processing, the report, the result's lineage, DICOM results, publishing)
        stand between it and its result. A pipeline that runs one model twice counts
        from the model's first step (then one stage may run in vain at a stop)."""
        return (
            self.state is JobState.RUNNING
            and self.step is None
            and set(self.work.models) <= self.devices_reached
        )


__all__ = ["Rank", "ReadyBatch", "ScheduledJob", "StepProgress", "effective_class"]
