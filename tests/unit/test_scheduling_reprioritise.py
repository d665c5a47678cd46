"""Re-prioritising a waiting job (the console's worklist action): re-filed under the new
class with a deadline from its arrival, ranked at once by the usual rule; refused for a
job that has started or finished. Fake clock throughout."""

from __future__ import annotations

import pytest
from tests.factories.scheduling_fakes import FakeSession, RecordingHooks, fake_work

from radserve.config import SchedulerSettings
from radserve.scheduling import (
    BatchDispatch,
    Dispatch,
    FakeClock,
    JobRequest,
    NotWaitingError,
    PriorityClass,
    Scheduler,
    run_serial,
)

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT
TAT = {"urgent": 600.0, "inpatient": 3600.0, "outpatient": 14400.0}


def _scheduler(clock: FakeClock, hooks: RecordingHooks | None = None) -> Scheduler:
    config = SchedulerSettings(tat_s=TAT, urgent_exclusive=False)
    return Scheduler(config, clock=clock, hooks=hooks)


def _batch_order(scheduler: Scheduler) -> list[str]:
    order: list[str] = []

    def record(d: Dispatch) -> None:
        if isinstance(d, BatchDispatch):
            order.extend(p.job_id for p in d.parts if p.job_id not in order)

    run_serial(scheduler, on_dispatch=record)
    return order


def test_raised_job_gets_the_new_class_and_a_deadline_from_its_arrival() -> None:
    clock = FakeClock(1000.0)
    scheduler = _scheduler(clock)
    session = FakeSession()
    scheduler.submit(JobRequest("a", fake_work(session, 2), OUT))
    scheduler.submit(JobRequest("b", fake_work(session, 2), INP))
    clock.advance(120.0)
    scheduler.submit(JobRequest("c", fake_work(session, 2), OUT))
    assert scheduler.snapshot().positions == {"b": 0, "a": 1, "c": 2}

    done = scheduler.reprioritise("c", URG)
    assert (done.old_cls, done.new_cls) == (OUT, URG)
    assert done.old_deadline == 1120.0 + TAT["outpatient"]
    assert done.deadline == 1120.0 + TAT["urgent"]  # arrival + the new TAT, not now + TAT
    assert done.position == 0
    info = scheduler.job_info("c")
    assert info is not None and info.cls is URG and info.deadline == done.deadline
    snapshot = scheduler.snapshot()
    assert snapshot.positions == {"c": 0, "b": 1, "a": 2}
    assert snapshot.queued[URG] == 1 and snapshot.queued[OUT] == 1
    assert _batch_order(scheduler) == ["c", "b", "a"]


def test_lowered_job_keeps_its_arrival_and_falls_behind() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock)
    session = FakeSession()
    scheduler.submit(JobRequest("er", fake_work(session, 2), URG))
    scheduler.submit(JobRequest("ward", fake_work(session, 2), INP))
    clock.advance(30.0)
    done = scheduler.reprioritise("er", OUT)
    assert done.deadline == 0.0 + TAT["outpatient"] and done.position == 1
    assert _batch_order(scheduler) == ["ward", "er"]


def test_raised_past_its_new_deadline_is_counted_as_a_miss_by_the_watchdog() -> None:
    """A study raised to URGENT after waiting longer than the URGENT TAT is late at
    once: the deadline is honest, not reset to now + 600 s."""
    clock = FakeClock()
    hooks = RecordingHooks()
    scheduler = _scheduler(clock, hooks)
    session = FakeSession()
    scheduler.submit(JobRequest("x", fake_work(session, 1), OUT))
    clock.advance(700.0)
    assert scheduler.tick() == []
    done = scheduler.reprioritise("x", URG)
    assert done.deadline == 600.0
    clock.advance(0.5)
    [miss] = scheduler.tick()
    assert miss.job_id == "x" and miss.cls is URG and miss.late_by == pytest.approx(100.5)
    assert scheduler.snapshot().deadline_misses[URG] == 1


def test_only_waiting_jobs_are_reprioritised() -> None:
    clock = FakeClock()
    hooks = RecordingHooks()
    scheduler = _scheduler(clock, hooks)
    session = FakeSession()
    scheduler.submit(JobRequest("run", fake_work(session, 1), INP))
    scheduler.submit(JobRequest("wait", fake_work(session, 1), OUT))
    first = scheduler.next_cpu_dispatch()  # "run" starts (its first CPU stage)
    assert first is not None and first.job_id == "run"
    with pytest.raises(NotWaitingError, match="has started"):
        scheduler.reprioritise("run", URG)
    with pytest.raises(NotWaitingError, match="not waiting"):
        scheduler.reprioritise("nope", URG)
    scheduler.cancel("wait")
    with pytest.raises(NotWaitingError):
        scheduler.reprioritise("wait", URG)
    # the refusals changed nothing
    info = scheduler.job_info("run")
    assert info is not None and info.cls is INP
    assert NotWaitingError("x").code == "job_not_waiting"


def test_same_class_is_a_no_op_on_rank_and_deadline() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock)
    scheduler.submit(JobRequest("a", fake_work(FakeSession(), 1), INP))
    clock.advance(10.0)
    done = scheduler.reprioritise("a", INP)
    assert done.old_deadline == done.deadline == TAT["inpatient"]
