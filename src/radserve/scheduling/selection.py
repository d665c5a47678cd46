"""Which job goes next, and which ready batches ride together: pure functions of the
job table, the clock reading and the configuration (no locking, no side effects).

Order: :meth:`ScheduledJob.rank <radserve.scheduling.state.ScheduledJob.rank>` (class
after aging, then earliest deadline), kept by the scheduler's rank indexes
(:mod:`radserve.scheduling.rank_index`). With ``urgent_exclusive`` only URGENT jobs are
eligible while URGENT work can run (one waiting or running, not one backing off or held
at an open breaker). A device batch is led by the best-ranked job with a
ready batch and filled with ready batches of jobs in the same effective class that use
the same model version and session and whose samples have the same shape, up to
``max_batch_size`` items.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.scheduling.breaker import CircuitBreakers
from radserve.scheduling.state import ReadyBatch, ScheduledJob
from radserve.scheduling.work import item_shape

URGENT = PriorityClass.URGENT


def eligible(
    order: Iterable[ScheduledJob],
    now: float,
    config: SchedulerSettings,
    *,
    urgent_active: bool,
) -> list[ScheduledJob]:
    """Of the active jobs in rank order (the scheduler's indexes), those eligible for
    work, best first: with ``urgent_exclusive`` only URGENT ones while URGENT work can
    run (``urgent_active``: :meth:`JobBook.urgent_active`); a job backing off after a
    retryable failure gets none until its ``not_before`` (nor does it hold the lane)."""
    exclusive = config.urgent_exclusive and urgent_active
    return [j for j in order if j.not_before <= now and (not exclusive or j.cls is URGENT)]


def may_start(cls: PriorityClass, routine_started: int, config: SchedulerSettings) -> bool:
    """Whether a waiting job of class ``cls`` may start (its first stage taken by a CPU
    thread) while ``routine_started`` routine jobs are started and unfinished: URGENT
    work always, a routine job while fewer than ``max_running`` are (each may hold a
    loaded volume). The scheduler (:meth:`JobBook.stage_unit`, which also holds a slot
    for a reserved job) and its simulation (:mod:`radserve.turnaround.simulate`) apply
    this one rule."""
    return cls is URGENT or routine_started < config.max_running


def may_prepare(
    job: object,
    *,
    preparing: bool,
    exhausted: bool,
    ready: int,
    blocked: bool,
    prepared: int,
    holding: Iterable[tuple[object, bool]],
    config: SchedulerSettings,
) -> bool:
    """Prepare ahead up to the per-job lookahead; beyond the global cap only for a job that
    outranks every job holding prepared batches (so memory stays bounded, and a newly
    arrived higher-class job is not stuck behind routine batches prepared earlier).

    Plain values, so the scheduler (:meth:`JobBook.feed_unit`) and its simulation
    (:mod:`radserve.turnaround.simulate`) apply one rule: ``job``'s step is ``preparing``
    a batch, has none left to prepare (``exhausted``), holds ``ready`` prepared ones, its
    model is ``blocked`` (breaker open); ``prepared``: batches prepared host-wide;
    ``holding``: the eligible jobs in rank order, each with whether it holds ready
    batches (read only once the cap is reached)."""
    if preparing or exhausted or ready >= config.lookahead_batches or blocked:
        return False
    if prepared < config.max_prepared_batches:
        return True
    for other, holds in holding:
        if other is job:
            return True
        if holds:
            return False
    return False


@dataclass(frozen=True)
class BatchPlan:
    """Ready batches to run in one device call: ``(job, how many of its ready batches)``."""

    lead: ScheduledJob
    take: list[tuple[ScheduledJob, int]]
    items: int
    hold: bool  # wait briefly: a compatible batch is being prepared


def plan_batch(
    order: list[ScheduledJob], now: float, config: SchedulerSettings, breakers: CircuitBreakers
) -> BatchPlan | None:
    ready = [
        j
        for j in order
        if j.step is not None and j.step.ready and not breakers.is_open(j.step.stage.model.name)
    ]
    if not ready:
        return None
    lead = ready[0]
    assert lead.step is not None
    stage, first = lead.step.stage, lead.step.ready[0]
    tier = lead.effective(now, config)

    def compatible(job: ScheduledJob) -> bool:
        s = job.step
        return (
            s is not None
            and s.stage.model == stage.model
            and s.stage.session is stage.session
            and job.effective(now, config) is tier
        )

    take: list[tuple[ScheduledJob, int]] = []
    size = 0
    for job in filter(compatible, ready):
        assert job.step is not None
        count = 0
        for rb in job.step.ready:
            if rb.shape != first.shape or (size and size + rb.items > config.max_batch_size):
                break
            size, count = size + rb.items, count + 1
        if count:
            take.append((job, count))
    hold = _worth_waiting(tier, size, first, now, config) and any(
        compatible(j)
        and j.step is not None
        and j.step.preparing
        and item_shape(j.step.stage.task) == first.shape
        for j in order
    )
    return BatchPlan(lead, take, size, hold)


def _worth_waiting(
    tier: PriorityClass, size: int, first: ReadyBatch, now: float, config: SchedulerSettings
) -> bool:
    """A routine batch below the size limit that has waited less than the queue delay."""
    delay = config.max_queue_delay_s
    return (
        tier is not URGENT
        and delay > 0
        and size < config.max_batch_size
        and now - first.since < delay
    )


__all__ = ["BatchPlan", "eligible", "may_prepare", "plan_batch"]
