"""The in-process executor: device workers, CPU pool, URGENT lane and watchdog threads
driving the scheduler. Threads wait on events, never on sleeps."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tests.factories.scheduling_fakes import FakeSession, RecordingHooks, fake_work

from radserve.config import SchedulerSettings
from radserve.scheduling import (
    DeadlineMiss,
    FakeClock,
    InProcessExecutor,
    JobEvent,
    JobRequest,
    JobState,
    PriorityClass,
    Scheduler,
)

URG, OUT = PriorityClass.URGENT, PriorityClass.OUTPATIENT
WAIT = 20.0  # seconds; generous for a loaded CI machine, never reached when things work


class EventHooks(RecordingHooks):
    """Records, and sets an event per job end and per deadline miss."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: dict[str, threading.Event] = {}
        self.missed = threading.Event()

    def end_of(self, job_id: str) -> threading.Event:
        return self.ended.setdefault(job_id, threading.Event())

    def on_state(self, event: JobEvent) -> None:
        super().on_state(event)
        if event.state.terminal:
            self.end_of(event.job_id).set()

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        super().on_deadline_miss(miss)
        self.missed.set()


class BlockingSession(FakeSession):
    """Blocks inside ``run`` until released: a long batch on the device."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def run(self, batch: np.ndarray) -> np.ndarray:
        self.entered.set()
        assert self.release.wait(WAIT), "test never released the device"
        return super().run(batch)


@pytest.fixture
def hooks() -> EventHooks:
    return EventHooks()


def test_many_jobs_on_two_devices_all_finish(hooks: EventHooks) -> None:
    scheduler = Scheduler(SchedulerSettings(max_running=3), hooks=hooks)
    executor = InProcessExecutor(scheduler, devices=("gpu0", "gpu1"), cpu_workers=2)
    session = FakeSession()
    works = [fake_work(session, 5, base=10.0 * n) for n in range(12)]
    executor.start()
    try:
        for n, work in enumerate(works):
            scheduler.submit(JobRequest(f"j{n}", work, URG if n == 6 else OUT))
        assert executor.wait_idle(WAIT)
    finally:
        executor.stop()
    finals = [e for e in hooks.states if e.state.terminal]
    assert len(finals) == 12 and all(e.state is JobState.SUCCEEDED for e in finals)
    for work in works:  # every batch merged exactly once, each into its own study
        assert sorted(work.steps[0].task.accepted) == [0, 1, 2, 3, 4]
        assert work.log == ["ingest", "report"]
    assert sum(session.calls) == 12 * 5 * 2
    assert {e.device for e in hooks.batches} <= {"gpu0", "gpu1"}


def test_watchdog_sees_a_miss_while_the_device_is_busy(hooks: EventHooks) -> None:
    clock = FakeClock()
    config = SchedulerSettings(tat_s={"outpatient": 5.0})
    scheduler = Scheduler(config, clock=clock, hooks=hooks)
    executor = InProcessExecutor(scheduler, watchdog_interval_s=0.05)
    session = BlockingSession()
    executor.start()
    try:
        scheduler.submit(JobRequest("j", fake_work(session, 2), OUT))
        assert session.entered.wait(WAIT)  # its first batch is on the device
        clock.advance(5.5)
        assert hooks.missed.wait(WAIT)  # seen by the watchdog, the batch still running
        assert not session.release.is_set()
        assert hooks.misses[0].late_by == pytest.approx(0.5)
        session.release.set()
        assert hooks.end_of("j").wait(WAIT)
    finally:
        session.release.set()
        executor.stop()
    assert hooks.final("j").state is JobState.SUCCEEDED  # type: ignore[union-attr]
    assert len(hooks.misses) == 1


def test_cancel_while_on_the_device_and_stop_leaves_the_rest(hooks: EventHooks) -> None:
    scheduler = Scheduler(hooks=hooks)
    executor = InProcessExecutor(scheduler)
    session = BlockingSession()
    executor.start()
    try:
        scheduler.submit(JobRequest("running", fake_work(session, 3), OUT))
        assert session.entered.wait(WAIT)
        scheduler.submit(JobRequest("waiting", fake_work(session, 3), OUT))
        assert scheduler.cancel("running")
        assert hooks.final("running") is None  # stops at the batch boundary, not before
        session.release.set()
        assert hooks.end_of("running").wait(WAIT)
        assert hooks.final("running").state is JobState.CANCELLED  # type: ignore[union-attr]
        assert hooks.end_of("waiting").wait(WAIT)
    finally:
        session.release.set()
        executor.stop()
    assert hooks.final("waiting").state is JobState.SUCCEEDED  # type: ignore[union-attr]

    # A stopped executor runs nothing; the job stays queued for a later start.
    scheduler.submit(JobRequest("later", fake_work(FakeSession(), 1), OUT))
    assert scheduler.snapshot().queued[OUT] == 1
    executor.start()
    try:
        assert hooks.end_of("later").wait(WAIT)
    finally:
        executor.stop()


class NativePanic(BaseException):
    """What a Rust extension's panic raises (pyo3's PanicException derives from
    BaseException, not Exception): the RLE decoder did, on a frame past its size."""


def test_a_unit_ending_in_a_native_panic_fails_its_job_not_the_worker(
    hooks: EventHooks,
) -> None:
    """The panic escaped every ``except Exception``: the one device worker ended, the job
    stayed running and every job after it stayed queued. Now it is the unit's error (the
    scheduler retries or fails the job) and the worker goes on."""
    scheduler = Scheduler(hooks=hooks)
    executor = InProcessExecutor(scheduler, devices=("gpu0",), cpu_workers=1)
    panicking = FakeSession()
    panicking.errors = [NativePanic("called `Option::unwrap()` on a `None` value")] * 10
    executor.start()
    try:
        scheduler.submit(JobRequest("panics", fake_work(panicking, 2), OUT))
        assert hooks.end_of("panics").wait(WAIT)
        scheduler.submit(JobRequest("after", fake_work(FakeSession(), 2), OUT))
        assert hooks.end_of("after").wait(WAIT)
    finally:
        executor.stop()
    failed = hooks.final("panics")
    assert failed is not None and failed.state is JobState.FAILED
    assert "NativePanic" in (failed.error_message or "")
    assert hooks.final("after").state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_executor_settings_are_checked() -> None:
    scheduler = Scheduler()
    with pytest.raises(ValueError, match="within a second"):
        InProcessExecutor(scheduler, watchdog_interval_s=2.0)
    with pytest.raises(ValueError, match="at least one device"):
        InProcessExecutor(scheduler, devices=())
