"""Ranking: class first, earliest deadline first within a class, aging so routine work
never starves, deadline misses seen by the watchdog within a second."""

from __future__ import annotations

import pytest
from tests.factories.scheduling_fakes import FakeSession, RecordingHooks, fake_work

from radserve.config import SchedulerSettings
from radserve.scheduling import (
    BatchDispatch,
    Dispatch,
    FakeClock,
    JobRequest,
    PriorityClass,
    Scheduler,
    execute,
    run_serial,
)

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT


def _batch_order(scheduler: Scheduler) -> list[str]:
    """Job ids in the order their device batches ran."""
    order: list[str] = []

    def record(d: Dispatch) -> None:
        if isinstance(d, BatchDispatch):
            order.extend(p.job_id for p in d.parts)

    run_serial(scheduler, on_dispatch=record)
    return order


def _first_seen(order: list[str]) -> list[str]:
    return list(dict.fromkeys(order))


def test_earliest_deadline_first_within_a_class() -> None:
    scheduler = Scheduler(clock=FakeClock())
    session = FakeSession()
    # Submitted latest-deadline first: "arrived" 0, 100 and 200 s ago.
    for job_id, age in [("late", 0.0), ("mid", 100.0), ("early", 200.0)]:
        scheduler.submit(JobRequest(job_id, fake_work(session, 2), OUT, age_s=age))
    assert scheduler.snapshot().positions == {"early": 0, "mid": 1, "late": 2}
    assert _first_seen(_batch_order(scheduler)) == ["early", "mid", "late"]


def test_class_goes_before_an_earlier_deadline() -> None:
    config = SchedulerSettings(tat_s={"inpatient": 1000, "outpatient": 1800})
    scheduler = Scheduler(config, clock=FakeClock())
    session = FakeSession()
    # The outpatient's deadline (800 s) is earlier than the inpatient's (1000 s), but its
    # slack is above aging_fraction x TAT (450 s): class decides.
    scheduler.submit(JobRequest("out", fake_work(session, 2), OUT, age_s=1000.0))
    scheduler.submit(JobRequest("in", fake_work(session, 2), INP))
    assert _first_seen(_batch_order(scheduler)) == ["in", "out"]


@pytest.mark.parametrize(("fraction", "expected"), [(0.25, ["old", "in"]), (0.0, ["in", "old"])])
def test_aging_promotes_routine_work_near_its_deadline(
    fraction: float, expected: list[str]
) -> None:
    config = SchedulerSettings(tat_s={"outpatient": 1000}, aging_fraction=fraction)
    clock = FakeClock()
    scheduler = Scheduler(config, clock=clock)
    session = FakeSession()
    scheduler.submit(JobRequest("old", fake_work(session, 2), OUT))
    clock.advance(700.0)  # slack 300 s: not yet under 0.25 x 1000
    assert scheduler.job_info("old").effective is OUT  # type: ignore[union-attr]
    clock.advance(60.0)  # slack 240 s: aged into INPATIENT, deadline 1000 < 760 + 300
    scheduler.submit(JobRequest("in", fake_work(session, 2), INP))
    info = scheduler.job_info("old")
    assert info is not None and info.effective is (INP if fraction else OUT)
    assert _first_seen(_batch_order(scheduler)) == expected


def test_routine_stream_cannot_starve_an_old_job() -> None:
    """New inpatient work keeps arriving; the outpatient still runs before its deadline."""
    config = SchedulerSettings(tat_s={"outpatient": 100, "inpatient": 50}, urgent_exclusive=False)
    clock = FakeClock()
    hooks = RecordingHooks()
    scheduler = Scheduler(config, clock=clock, hooks=hooks)
    session = FakeSession(clock, seconds_per_call=1.0)
    scheduler.submit(JobRequest("old", fake_work(session, 3), OUT))
    for n in range(200):
        # One fresh inpatient job per batch run: without aging it would always win.
        scheduler.submit(JobRequest(f"in{n}", fake_work(session, 1), INP))
        for _ in range(4):  # ingest + prepare + batch + merge, roughly
            d = scheduler.next_dispatch("cpu") or scheduler.next_cpu_dispatch()
            if d is None:
                break
            scheduler.complete(d, execute(d))
        if hooks.final("old") is not None:
            break
    final = hooks.final("old")
    assert final is not None and final.state.value == "succeeded"
    assert final.at <= 100.0  # before its deadline
    assert not hooks.misses or all(m.job_id != "old" for m in hooks.misses)


def test_aged_inpatient_still_ranks_behind_a_genuine_urgent() -> None:
    config = SchedulerSettings(urgent_exclusive=False)
    clock = FakeClock()
    scheduler = Scheduler(config, clock=clock)
    session = FakeSession()
    scheduler.submit(JobRequest("in", fake_work(session, 2), INP))
    clock.advance(290.0)  # slack 10 s < 0.25 x 300: aged into the URGENT class
    scheduler.submit(JobRequest("er", fake_work(session, 2), URG))  # deadline 350 > 300
    assert scheduler.job_info("in").effective is URG  # type: ignore[union-attr]
    assert _first_seen(_batch_order(scheduler)) == ["er", "in"]


def test_deadline_miss_detected_by_the_watchdog_within_a_second() -> None:
    """The device is busy with one long batch: the miss is seen by tick(), not when the
    next batch forms."""
    config = SchedulerSettings(tat_s={"outpatient": 10.0})
    clock = FakeClock()
    hooks = RecordingHooks()
    scheduler = Scheduler(config, clock=clock, hooks=hooks)
    scheduler.submit(JobRequest("slow", fake_work(FakeSession(), 1), OUT))
    while (d := scheduler.next_dispatch("gpu0") or scheduler.next_cpu_dispatch()) is not None:
        if isinstance(d, BatchDispatch):
            break  # this batch now "runs" on the device while time passes
        scheduler.complete(d, execute(d))
    assert isinstance(d, BatchDispatch)
    seen = []
    while not seen:
        clock.advance(0.5)  # the watchdog's period
        seen = scheduler.tick()
    assert [m.job_id for m in seen] == ["slow"] and hooks.misses == seen
    assert 0.0 < seen[0].late_by <= 1.0
    assert scheduler.snapshot().deadline_misses[OUT] == 1
    assert scheduler.tick() == []  # counted once
    scheduler.complete(d, execute(d))
    run_serial(scheduler)
    assert hooks.final("slow").state.value == "succeeded"  # type: ignore[union-attr]
    assert scheduler.snapshot().deadline_misses[OUT] == 1


def test_late_finish_between_ticks_still_counts_as_a_miss() -> None:
    config = SchedulerSettings(tat_s={"inpatient": 1.0})
    clock = FakeClock()
    hooks = RecordingHooks()
    scheduler = Scheduler(config, clock=clock, hooks=hooks)
    scheduler.submit(JobRequest("j", fake_work(FakeSession(clock, seconds_per_call=2.0), 1), INP))
    run_serial(scheduler)
    assert [m.job_id for m in hooks.misses] == ["j"]
    assert scheduler.snapshot().deadline_misses[INP] == 1
