"""What a job's status says while none of its server's work can run: the scheduler's hold
(leases unproven, the schema changed) is named, with since when, and there is no ETA
(radserve.service.work_waits); nothing is named while work can run."""

from __future__ import annotations

import datetime as dt

from radserve.scheduling import InProcessExecutor, Scheduler
from radserve.scheduling.clock import FakeClock
from radserve.service.leases import HELD_MESSAGE, HELD_REASON
from radserve.service.work_waits import WorkWaits

NOW = 1_800_000_000.0  # the wall clock, seconds


def test_a_held_scheduler_is_named_with_since_when_and_nothing_once_released() -> None:
    clock = FakeClock()
    scheduler = Scheduler(clock=clock)
    waits = WorkWaits(scheduler, InProcessExecutor(scheduler), wall=lambda: NOW)
    assert waits() is None
    scheduler.hold(HELD_REASON, HELD_MESSAGE)
    clock.advance(12.0)
    wait = waits()
    assert wait is not None
    assert (wait.reason, wait.message) == (HELD_REASON, HELD_MESSAGE)
    assert wait.since == dt.datetime.fromtimestamp(NOW - 12.0, dt.UTC)
    scheduler.release()
    assert waits() is None
