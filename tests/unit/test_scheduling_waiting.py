"""The waiting index (O(log n) admission) gives exactly the order the scheduler used to
get by sorting every waiting job by ``ScheduledJob.rank(now)`` on each submission: checked
on seeded random mixes of classes, ages, clock steps (aging), promotions, cancellations,
started jobs and long pauses."""

from __future__ import annotations

import contextlib
import random

import pytest
from tests.factories.scheduling_fakes import FakeSession, fake_work

from radserve.config import SchedulerSettings
from radserve.domain.jobs import JobState
from radserve.scheduling import FakeClock, JobRequest, NotWaitingError, PriorityClass, Scheduler
from radserve.scheduling.dispatch import DispatchOutcome

CLASSES = list(PriorityClass)


def _full_sort(scheduler: Scheduler) -> list[str]:
    """The old rule: every active, not started job sorted by its rank now."""
    book, now = scheduler._book, scheduler.clock.now()
    waiting = [j for j in book.jobs.values() if j.active and j.state is JobState.QUEUED]
    return [j.id for j in sorted(waiting, key=lambda j: j.rank(now, scheduler.config))]


def _positions(scheduler: Scheduler) -> list[str]:
    positions = scheduler.snapshot().positions
    return sorted(positions, key=positions.__getitem__)


@pytest.mark.parametrize("seed", [1, 2, 3, 11, 2024])
def test_order_equals_the_full_sort_on_a_random_mix(seed: int) -> None:
    rng = random.Random(seed)
    config = SchedulerSettings(
        tat_s={"urgent": 60, "inpatient": 600, "outpatient": 1800},
        aging_fraction=rng.choice([0.0, 0.25, 0.5]),
        max_running=2,
    )
    clock = FakeClock(1000.0)
    scheduler = Scheduler(config, clock=clock)
    session = FakeSession()
    ids: list[str] = []
    checked = 0
    for n in range(300):
        op = rng.random()
        if op < 0.6 or not ids:
            job_id = f"j{n}"
            cls = rng.choice(CLASSES)
            age = rng.choice([0.0, 0.0, rng.uniform(0, 2000)])
            ticket = scheduler.submit(JobRequest(job_id, fake_work(session, 1), cls, age_s=age))
            ids.append(job_id)
            expected = _full_sort(scheduler)
            assert ticket.position == expected.index(job_id)
        elif op < 0.75:
            clock.advance(rng.uniform(0, 300))  # jobs age into the class above
        elif op < 0.82:
            scheduler.promote(rng.choice(ids))
        elif op < 0.88:
            scheduler.cancel(rng.choice(ids))
        elif op < 0.95:
            scheduler.next_cpu_dispatch()  # starts the best waiting jobs
        else:
            clock.advance(rng.uniform(1000, 3000))  # a long pause: most jobs age
        expected = _full_sort(scheduler)
        assert _positions(scheduler) == expected
        for job_id in rng.sample(ids, min(3, len(ids))):
            info = scheduler.job_info(job_id)
            if info is not None:
                want = expected.index(job_id) if job_id in expected else None
                assert info.position == want
        checked += len(expected)
    assert checked > 1000  # the queue was long enough to mean something


def test_queue_limit_counts_waiting_jobs_of_the_class() -> None:
    """The admission limit reads the index's per-class count: started and cancelled jobs
    leave it."""
    from radserve.scheduling import QueueFullError

    config = SchedulerSettings(queue_limits={"outpatient": 2}, max_running=1)
    scheduler = Scheduler(config, clock=FakeClock())
    session = FakeSession()
    out = PriorityClass.OUTPATIENT
    scheduler.submit(JobRequest("a", fake_work(session, 1), out))
    scheduler.submit(JobRequest("b", fake_work(session, 1), out))
    with pytest.raises(QueueFullError):
        scheduler.submit(JobRequest("c", fake_work(session, 1), out))
    assert scheduler.cancel("b")
    scheduler.submit(JobRequest("c", fake_work(session, 1), out))
    assert scheduler.next_cpu_dispatch() is not None  # "a" starts
    scheduler.submit(JobRequest("d", fake_work(session, 1), out))
    assert _positions(scheduler) == ["c", "d"]


def _old_ranked(scheduler: Scheduler, now: float) -> list[str]:
    """The dispatch order as the scheduler used to compute it on every call: every active
    job (waiting and started) sorted by its rank now, URGENT only while one is unfinished
    (``urgent_exclusive``), jobs backing off left out."""
    config = scheduler.config
    active = [j for j in scheduler._book.jobs.values() if j.active]
    if config.urgent_exclusive and any(j.cls is PriorityClass.URGENT for j in active):
        active = [j for j in active if j.cls is PriorityClass.URGENT]
    eligible = [j for j in active if j.not_before <= now]
    return [j.id for j in sorted(eligible, key=lambda j: j.rank(now, config))]


@pytest.mark.parametrize("seed", [5, 6, 7, 99, 31337])
def test_dispatch_order_equals_the_old_sort_on_random_queues(seed: int) -> None:
    """What dispatch hands work to (both rank indexes merged) is the order the full sort
    of every active job gave, through submissions, starts, aging, promotions of waiting
    and running jobs, class changes, back-offs, cancellations and finished jobs."""
    rng = random.Random(seed)
    config = SchedulerSettings(
        tat_s={"urgent": 60, "inpatient": 600, "outpatient": 1800},
        aging_fraction=rng.choice([0.0, 0.25, 0.5]),
        max_running=rng.choice([1, 3, 6]),
        urgent_exclusive=rng.random() < 0.5,
    )
    clock = FakeClock(1000.0)
    scheduler = Scheduler(config, clock=clock)
    session = FakeSession()
    ids: list[str] = []
    compared = 0
    for n in range(400):
        op = rng.random()
        if op < 0.45 or not ids:
            cls = rng.choice(CLASSES)
            age = rng.choice([0.0, 0.0, rng.uniform(0, 2000)])
            scheduler.submit(JobRequest(f"j{n}", fake_work(session, 1), cls, age_s=age))
            ids.append(f"j{n}")
        elif op < 0.6:
            clock.advance(rng.uniform(0, 300))
        elif op < 0.67:
            scheduler.promote(rng.choice(ids))  # waiting or running
        elif op < 0.73:
            with contextlib.suppress(NotWaitingError):
                scheduler.reprioritise(rng.choice(ids), rng.choice(CLASSES))
        elif op < 0.77:
            scheduler.cancel(rng.choice(ids))
        elif op < 0.8:
            job = scheduler._book.jobs.get(rng.choice(ids))
            if job is not None:  # a retryable failure's back-off
                job.not_before = clock.now() + rng.uniform(1, 200)
        elif op < 0.97:
            unit = scheduler.next_cpu_dispatch()  # starts jobs; finishes some at random
            if unit is not None and rng.random() < 0.7:
                scheduler.complete(unit, DispatchOutcome(None))
        else:
            clock.advance(rng.uniform(1000, 3000))
        now = scheduler.clock.now()
        want = _old_ranked(scheduler, now)
        assert [j.id for j in scheduler._book.ranked(now)] == want
        everyone = [j for j in scheduler._book.jobs.values() if j.active]
        full = [j.id for j in sorted(everyone, key=lambda j: j.rank(now, config))]
        assert [q.job_id for q in scheduler.queue_order()[1]] == full
        compared += len(want)
    assert compared > 1000


def test_finished_jobs_are_not_kept_alive_by_their_aging_entries() -> None:
    """A job that left the indexes (it ran and ended) is freed at once: its aging entry
    names it, it does not hold it. Before, each finished job's work (a real job's
    volumes, results and report) stayed until its aging time, 22 minutes after arrival
    for an outpatient job, so a burst of jobs held all of theirs; and the aging heaps
    stay within twice the jobs indexed (plus a constant)."""
    import gc
    import weakref

    from tests.factories.scheduling_fakes import RecordingHooks

    from radserve.scheduling import run_serial

    clock = FakeClock(1000.0)
    hooks = RecordingHooks()
    scheduler = Scheduler(SchedulerSettings(max_running=2), clock=clock, hooks=hooks)
    session = FakeSession()
    works: list[weakref.ref[object]] = []
    jobs = 300
    for n in range(jobs):
        work = fake_work(session, 1)
        works.append(weakref.ref(work))
        scheduler.submit(JobRequest(f"j{n}", work, PriorityClass.OUTPATIENT))
        del work
        if n % 3 == 2:
            run_serial(scheduler)
        clock.advance(1.0)  # 300 s in all: well before any outpatient job ages
    run_serial(scheduler)
    assert all(hooks.final(f"j{n}").state is JobState.SUCCEEDED for n in range(jobs))  # type: ignore[union-attr]
    gc.collect()
    assert [r for r in works if r() is not None] == []  # no finished job's work is kept
    book = scheduler._book
    for index in (book.queue, book.started):
        assert len(index) == 0
        assert len(index._aging) <= 64
