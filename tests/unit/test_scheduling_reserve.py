"""Deadline-risk policy ``reserve``: the next free routine slot goes to the reserved job
before every other job of its class or a lower one (aged into a better class or not),
never before a better class's job or URGENT work; how that differs from ``promote``;
the slot is released when the job starts or ends (fake clock, one routine slot)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.factories.scheduling_fakes import FakeSession, RecordingHooks, fake_work

from radserve.config import SchedulerSettings
from radserve.scheduling import (
    FakeClock,
    JobRequest,
    JobState,
    PriorityClass,
    Scheduler,
    execute,
    run_serial,
)

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT


def _queue(hooks: RecordingHooks) -> Scheduler:
    """One routine slot; waiting, by rank: "inp" (INPATIENT, 300 s to its deadline),
    "aged" (OUTPATIENT 1,400 s old: aged into the INPATIENT tier), "older" and "risk"
    (OUTPATIENT, 1,700 and 1,800 s to their deadlines)."""
    scheduler = Scheduler(SchedulerSettings(max_running=1), clock=FakeClock(), hooks=hooks)
    session = FakeSession()
    for job_id, cls, age in [
        ("risk", OUT, 0.0),
        ("older", OUT, 100.0),
        ("aged", OUT, 1400.0),
        ("inp", INP, 0.0),
    ]:
        scheduler.submit(JobRequest(job_id, fake_work(session, 2), cls, age_s=age))
    return scheduler


def _starts(hooks: RecordingHooks) -> list[str]:
    return [e.job_id for e in hooks.states if e.state is JobState.RUNNING]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (lambda s: None, ["inp", "aged", "older", "risk"]),
        (lambda s: s.promote("risk"), ["inp", "aged", "risk", "older"]),
        # ahead of "aged" (its own class, aged one up) too; never ahead of "inp"
        (lambda s: s.reserve("risk"), ["inp", "risk", "aged", "older"]),
    ],
    ids=["none", "promote", "reserve"],
)
def test_start_order_under_each_policy(
    policy: Callable[[Scheduler], object], expected: list[str]
) -> None:
    hooks = RecordingHooks()
    scheduler = _queue(hooks)
    policy(scheduler)
    run_serial(scheduler)
    assert _starts(hooks) == expected
    assert all(hooks.final(j).state is JobState.SUCCEEDED for j in expected)  # type: ignore[union-attr]


def test_the_held_slot_blocks_its_class_not_urgent_work_and_frees_at_the_start() -> None:
    hooks = RecordingHooks()
    scheduler = _queue(hooks)
    scheduler.cancel("inp")
    first = scheduler.next_cpu_dispatch()  # "aged" starts: the slot is taken
    assert first is not None and first.job_id == "aged"
    assert scheduler.reserve("risk")
    assert not scheduler.reserve("risk")  # held already
    assert not scheduler.reserve("aged")  # started: nothing to hold (promote it instead)
    session = FakeSession()
    scheduler.submit(JobRequest("urgent", fake_work(session, 1), URG))
    assert not scheduler.reserve("urgent")  # URGENT never waits for a slot
    scheduler.submit(JobRequest("inp2", fake_work(session, 1), INP))
    scheduler.complete(first, execute(first))
    run_serial(scheduler)
    # URGENT starts at once; the INPATIENT job (a better class) takes the slot "aged"
    # frees before "risk"; "risk" before "older"
    assert _starts(hooks) == ["aged", "urgent", "inp2", "risk", "older"]
    assert scheduler._book.reserved == {}


def test_a_reserved_job_that_ends_waiting_releases_the_slot() -> None:
    hooks = RecordingHooks()
    scheduler = _queue(hooks)
    assert scheduler.reserve("risk")
    assert scheduler.cancel("risk")
    run_serial(scheduler)
    assert _starts(hooks) == ["inp", "aged", "older"]  # nobody waits for it
    assert scheduler._book.reserved == {}


def test_two_reservations_go_by_class_then_deadline() -> None:
    hooks = RecordingHooks()
    scheduler = _queue(hooks)
    session = FakeSession()
    scheduler.submit(JobRequest("inp-late", fake_work(session, 1), INP, age_s=-100.0))
    assert scheduler.reserve("risk") and scheduler.reserve("inp-late")
    run_serial(scheduler)
    # the INPATIENT reservation holds the slot first: ahead of "inp" (its own class)
    assert _starts(hooks) == ["inp-late", "inp", "risk", "aged", "older"]
