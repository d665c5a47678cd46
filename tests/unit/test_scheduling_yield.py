"""Routine CPU work already running yields to an URGENT job at its next checkpoint
(``scheduler.yield_to_urgent``): the gate the scheduler keeps, which units pause, the
executor running them, and the checkpoints in the real ingest code. Orders and states
only: threads wait on events, never on sleeps, and no time is asserted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.factories.dicom_series import make_ct_series
from tests.factories.scheduling_fakes import FakeSession, RecordingHooks, fake_work

from radserve.checkpoints import PauseLog, carry, checkpoint, paused_within, yielding_to
from radserve.config import JobSettings, SchedulerSettings
from radserve.errors import InferenceError
from radserve.ingest import discover_series, load_series
from radserve.progress import StageTimer
from radserve.scheduling import (
    BatchDispatch,
    CpuStage,
    FakeClock,
    InProcessExecutor,
    JobEvent,
    JobRequest,
    JobState,
    ModelKey,
    PriorityClass,
    Scheduler,
    Stage,
    StageDispatch,
    execute,
    run_serial,
)

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT
WAIT = 20.0  # seconds; generous for a loaded CI machine, never reached when things work


# --- the gate, on the scheduler alone (fake clock, no threads) -------------------------
def test_the_gate_closes_while_an_urgent_job_is_unfinished() -> None:
    scheduler = Scheduler(clock=FakeClock())
    assert scheduler.wait_routine(0)
    scheduler.submit(JobRequest("r", fake_work(FakeSession(), 2), OUT))
    assert scheduler.wait_routine(0)  # routine work alone never waits
    scheduler.submit(JobRequest("u", fake_work(FakeSession(), 2), URG))
    assert not scheduler.wait_routine(0)
    run_serial(scheduler)
    assert scheduler.idle and scheduler.wait_routine(0)  # open again once it is done


@pytest.mark.parametrize(
    ("end", "expect_open"),
    [("cancel", True), ("reprioritise", False), ("none", False)],
)
def test_the_gate_follows_cancel_and_reprioritise(end: str, expect_open: bool) -> None:
    scheduler = Scheduler(clock=FakeClock())
    scheduler.submit(JobRequest("r", fake_work(FakeSession(), 1), OUT))
    if end == "reprioritise":  # a waiting routine study raised to URGENT closes it too
        scheduler.reprioritise("r", URG)
    else:
        scheduler.submit(JobRequest("u", fake_work(FakeSession(), 1), URG))
        if end == "cancel":
            assert scheduler.cancel("u")
    assert scheduler.wait_routine(0) is expect_open


def test_a_job_aged_into_the_urgent_class_neither_closes_the_gate_nor_skips_it() -> None:
    clock = FakeClock()
    config = SchedulerSettings(urgent_exclusive=False)
    scheduler = Scheduler(config, clock=clock)
    scheduler.submit(JobRequest("old", fake_work(FakeSession(), 1), INP))
    clock.advance(290.0)  # slack 10 s < 0.25 x 300 s: aged into URGENT
    assert scheduler.job_info("old").effective is URG  # type: ignore[union-attr]
    assert scheduler.wait_routine(0)
    dispatch = scheduler.next_cpu_dispatch()
    assert isinstance(dispatch, StageDispatch) and scheduler.yields(dispatch)


def test_routine_cpu_units_yield_urgent_ones_and_device_batches_do_not() -> None:
    scheduler = Scheduler(SchedulerSettings(urgent_exclusive=False), clock=FakeClock())
    session = FakeSession()
    scheduler.submit(JobRequest("r", fake_work(session, 1), OUT))
    scheduler.submit(JobRequest("u", fake_work(session, 1), URG))
    seen: dict[tuple[str, str], bool] = {}
    while True:
        d = scheduler.next_dispatch("cpu") or scheduler.next_cpu_dispatch()
        if d is None:
            break
        jobs = {p.job_id for p in d.parts} if isinstance(d, BatchDispatch) else {d.job_id}
        for job_id in jobs:
            seen[(job_id, type(d).__name__)] = scheduler.yields(d)
        scheduler.complete(d, execute(d))
    assert seen[("r", "StageDispatch")] and seen[("r", "PrepareDispatch")]
    assert seen[("r", "MergeDispatch")]
    assert not any(v for (job, _), v in seen.items() if job == "u")
    assert not seen[("r", "BatchDispatch")]


def test_yield_to_urgent_off_keeps_the_gate_open() -> None:
    scheduler = Scheduler(SchedulerSettings(yield_to_urgent=False), clock=FakeClock())
    scheduler.submit(JobRequest("u", fake_work(FakeSession(), 1), URG))
    assert scheduler.wait_routine(0)


def _backing_off_urgent(
    clock: FakeClock, config: SchedulerSettings | None = None
) -> tuple[Scheduler, RecordingHooks]:
    """A scheduler whose URGENT job ``u`` hit a retryable device error and now backs off
    for ``retry_backoff_s`` = 5 s (a PACS or device hiccup), with a routine job ``r``."""
    hooks = RecordingHooks()
    jobs = JobSettings(max_retries=3, retry_backoff_s=5)
    scheduler = Scheduler(config or SchedulerSettings(), jobs=jobs, clock=clock, hooks=hooks)
    flaky = FakeSession()
    flaky.errors = [InferenceError("device hiccup")]
    scheduler.submit(JobRequest("u", fake_work(flaky, 1), URG))
    run_serial(scheduler)  # ingest, the failed batch: now backing off
    assert hooks.final("u") is None and len(flaky.calls) == 1
    other = FakeSession()
    scheduler.submit(JobRequest("r", fake_work(other, 1, model=ModelKey("b", "1")), OUT))
    return scheduler, hooks


def test_an_urgent_job_backing_off_does_not_hold_the_routine_gate() -> None:
    """Only URGENT work that can run now closes the gate: not a job waiting out its
    retry back-off; the gate closes again once the back-off ends."""
    clock = FakeClock()
    scheduler, hooks = _backing_off_urgent(clock)
    assert scheduler.wait_routine(0)  # open while the URGENT job cannot run
    clock.advance(5.1)
    scheduler.tick()  # the watchdog's round sees the back-off end
    assert not scheduler.wait_routine(0)
    run_serial(scheduler)
    assert hooks.final("u").state is JobState.SUCCEEDED  # type: ignore[union-attr]
    assert scheduler.wait_routine(0)


def test_urgent_exclusive_lets_routine_work_run_while_the_urgent_job_backs_off() -> None:
    """``urgent_exclusive`` (the default) reads the same definition: the routine job runs
    to its end during the URGENT job's back-off instead of waiting for it."""
    clock = FakeClock()
    scheduler, hooks = _backing_off_urgent(clock)
    run_serial(scheduler)
    assert hooks.final("r").state is JobState.SUCCEEDED  # type: ignore[union-attr]
    assert hooks.final("u") is None  # still backing off: the retry is not due
    clock.advance(5.1)
    run_serial(scheduler)
    assert hooks.final("u").state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_urgent_exclusive_still_holds_routine_work_back_while_urgent_work_can_run() -> None:
    clock = FakeClock()
    scheduler, _ = _backing_off_urgent(clock)
    clock.advance(5.1)  # the back-off is over: URGENT work is due again
    order: list[str] = []
    run_serial(scheduler, on_dispatch=lambda d: order.append(_job_of(d)))
    assert order.index("r") > max(i for i, job in enumerate(order) if job == "u")


def _job_of(dispatch: object) -> str:
    if isinstance(dispatch, BatchDispatch):
        return dispatch.parts[0].job_id
    return dispatch.job_id  # type: ignore[attr-defined,no-any-return]


# --- the executor: routine stages pause mid-way ---------------------------------------
class PiecesWork:
    """CPU stages only, each appending ``<name>: <stage>`` to a shared log. The routine
    one's single stage runs in two pieces with a checkpoint between (as ingest has
    between files), the second optionally on a pool thread (as decoding does)."""

    def __init__(
        self,
        log: list[str],
        name: str,
        stages: tuple[str, ...] = ("ingest", "report"),
        *,
        between: threading.Event | None = None,
        on_pool: bool = False,
        before: Callable[[str], None] | None = None,
    ) -> None:
        self.log, self.name, self.on_pool = log, name, on_pool
        self.between, self.before = between, before
        self.in_stage = threading.Event()
        self.at_checkpoint = threading.Event()
        self._plan: list[Stage] = [CpuStage(s, self._stage(s)) for s in stages]

    @property
    def models(self) -> tuple[str, ...]:
        return ()

    def _stage(self, stage: str) -> Callable[[], None]:
        def run() -> None:
            if self.before is not None:
                self.before(stage)
            if self.between is None:
                self.log.append(f"{self.name}: {stage}")
                return
            self.log.append(f"{self.name}: piece 1")
            self.in_stage.set()
            assert self.between.wait(WAIT), "test never let the routine stage go on"
            if self.on_pool:
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(carry(self._second)).result()
            else:
                self._second()

        return run

    def _second(self) -> None:
        self.at_checkpoint.set()
        checkpoint()
        self.log.append(f"{self.name}: piece 2")

    def next_stage(self) -> Stage | None:
        return self._plan.pop(0) if self._plan else None

    def result(self) -> object:
        return None


class EndHooks(RecordingHooks):
    def __init__(self) -> None:
        super().__init__()
        self.ended: dict[str, threading.Event] = {}

    def end_of(self, job_id: str) -> threading.Event:
        return self.ended.setdefault(job_id, threading.Event())

    def on_state(self, event: JobEvent) -> None:
        super().on_state(event)
        if event.state.terminal:
            self.end_of(event.job_id).set()


@pytest.mark.parametrize("on_pool", [False, True], ids=["same thread", "pool thread"])
def test_a_running_routine_stage_waits_at_its_checkpoint_for_the_urgent_job(
    on_pool: bool,
) -> None:
    """... and its final timings say how long it waited (``paused``, inside its
    ``ingest``: the URGENT job takes 0.2 s); the URGENT job's never pause."""
    log: list[str] = []
    hooks = EndHooks()
    scheduler = Scheduler(hooks=hooks)
    executor = InProcessExecutor(scheduler, cpu_workers=2)
    go = threading.Event()
    routine = PiecesWork(log, "r", ("ingest",), between=go, on_pool=on_pool)

    def after_the_routine_reached_its_checkpoint(stage: str) -> None:
        if stage == "ingest":
            assert routine.at_checkpoint.wait(WAIT)
            time.sleep(0.2)  # the pause to be measured, not a synchronisation

    urgent = PiecesWork(log, "u", before=after_the_routine_reached_its_checkpoint)
    executor.start()
    try:
        scheduler.submit(JobRequest("r", routine, OUT))
        assert routine.in_stage.wait(WAIT)  # the routine stage is half-way
        scheduler.submit(JobRequest("u", urgent, URG))
        go.set()
        assert hooks.end_of("u").wait(WAIT) and hooks.end_of("r").wait(WAIT)
    finally:
        go.set()
        executor.stop()
    assert log == ["r: piece 1", "u: ingest", "u: report", "r: piece 2"]
    assert all(e.state is JobState.SUCCEEDED for e in hooks.states if e.state.terminal)
    r, u = hooks.final("r"), hooks.final("u")
    assert r is not None and u is not None
    assert 0 < r.timings["paused"] <= r.timings["ingest"] <= r.timings["run"]
    assert "paused" not in u.timings


@pytest.mark.parametrize(
    ("settings", "lane"),
    [(SchedulerSettings(yield_to_urgent=False), True), (SchedulerSettings(), False)],
    ids=["yield_to_urgent off", "no URGENT lane"],
)
def test_the_routine_stage_runs_on_without_yielding_or_without_an_urgent_lane(
    settings: SchedulerSettings, lane: bool
) -> None:
    """Without an URGENT lane a paused routine unit could hold the only thread the URGENT
    job's CPU stages can run on: it does not pause then."""
    log: list[str] = []
    hooks = EndHooks()
    scheduler = Scheduler(settings, hooks=hooks)
    executor = InProcessExecutor(scheduler, cpu_workers=1, urgent_lane=lane)
    go, second = threading.Event(), threading.Event()
    routine = PiecesWork(log, "r", ("ingest",), between=go)
    routine._second = lambda: (checkpoint(), log.append("r: piece 2"), second.set())  # type: ignore[method-assign]

    def urgent_waits_for_the_routine_piece(stage: str) -> None:
        if stage == "ingest":
            assert second.wait(WAIT), "the routine stage paused although yielding is off"

    executor.start()
    try:
        scheduler.submit(JobRequest("r", routine, OUT))
        assert routine.in_stage.wait(WAIT)
        scheduler.submit(
            JobRequest("u", PiecesWork(log, "u", before=urgent_waits_for_the_routine_piece), URG)
        )
        go.set()
        assert hooks.end_of("u").wait(WAIT) and hooks.end_of("r").wait(WAIT)
    finally:
        go.set()
        executor.stop()
    assert log == ["r: piece 1", "r: piece 2", "u: ingest", "u: report"]


def test_a_paused_worker_thread_runs_urgent_work_meanwhile() -> None:
    """One CPU worker, paused in a routine stage, and one URGENT lane, held by a first
    URGENT job: a second URGENT job still runs, on the paused worker's thread."""
    log: list[str] = []
    hooks = EndHooks()
    scheduler = Scheduler(hooks=hooks)
    executor = InProcessExecutor(scheduler, cpu_workers=1)
    go, first_in, first_go = threading.Event(), threading.Event(), threading.Event()

    def hold_the_first(stage: str) -> None:
        if stage == "ingest":
            first_in.set()
            assert first_go.wait(WAIT)

    routine = PiecesWork(log, "r", ("ingest",), between=go)
    executor.start()
    try:
        scheduler.submit(JobRequest("r", routine, OUT))
        assert routine.in_stage.wait(WAIT)
        scheduler.submit(JobRequest("u1", PiecesWork(log, "u1", before=hold_the_first), URG))
        go.set()
        assert routine.at_checkpoint.wait(WAIT) and first_in.wait(WAIT)
        scheduler.submit(JobRequest("u2", PiecesWork(log, "u2"), URG))
        assert hooks.end_of("u2").wait(WAIT), "the second URGENT job found no thread"
        assert hooks.final("u1") is None and hooks.final("r") is None
        first_go.set()
        assert hooks.end_of("u1").wait(WAIT) and hooks.end_of("r").wait(WAIT)
    finally:
        go.set()
        first_go.set()
        executor.stop()
    assert log == [
        "r: piece 1",
        "u2: ingest",
        "u2: report",
        "u1: ingest",
        "u1: report",
        "r: piece 2",
    ]
    assert all(e.state is JobState.SUCCEEDED for e in hooks.states if e.state.terminal)


def test_a_stopping_executor_lets_a_paused_routine_stage_finish() -> None:
    """Stop waits for units at their boundary: a routine unit paused for an URGENT job
    that will not finish before the stop must not hold the stop forever."""
    log: list[str] = []
    hooks = EndHooks()
    scheduler = Scheduler(hooks=hooks)
    executor = InProcessExecutor(scheduler, cpu_workers=2)
    go, urgent_in, urgent_go = threading.Event(), threading.Event(), threading.Event()

    def hold_the_urgent_ingest(stage: str) -> None:
        if stage == "ingest":
            urgent_in.set()
            assert urgent_go.wait(WAIT)

    routine = PiecesWork(log, "r", ("ingest",), between=go)
    executor.start()
    try:
        scheduler.submit(JobRequest("r", routine, OUT))
        assert routine.in_stage.wait(WAIT)
        scheduler.submit(JobRequest("u", PiecesWork(log, "u", before=hold_the_urgent_ingest), URG))
        assert urgent_in.wait(WAIT)
        go.set()  # the routine stage reaches its checkpoint and pauses ...
        executor.stop(wait=False)  # ... until the executor stops
        assert hooks.end_of("r").wait(WAIT)
        assert hooks.final("u") is None  # the URGENT job is still running
    finally:
        go.set()
        urgent_go.set()
    assert log[:2] == ["r: piece 1", "r: piece 2"]


# --- the checkpoints module and the real stage code -----------------------------------
def test_checkpoint_calls_the_installed_waiter_only() -> None:
    calls: list[str] = []
    checkpoint()  # no waiter: nothing happens
    with yielding_to(lambda: calls.append("outer")):
        checkpoint()
        with yielding_to(None):  # URGENT work inside routine code: no waiting
            checkpoint()
        with ThreadPoolExecutor(1) as pool:
            pool.submit(checkpoint).result()  # a pool thread does not inherit it ...
            pool.submit(carry(checkpoint)).result()  # ... unless carried
    checkpoint()
    assert calls == ["outer", "outer"]
    assert carry(len) is len  # nothing to bind outside routine work


def test_a_pause_log_counts_overlapping_waits_once() -> None:
    log = PauseLog()
    for span in [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (7.0, 7.0005)]:  # the last: no pause
        log.add(*span)
    assert log.within() == pytest.approx(4.0)
    assert log.within(1.5, 5.5) == pytest.approx(2.0)
    assert log.within(3.0, 5.0) == 0.0
    assert paused_within(0.0, 10.0) == 0.0  # outside a routine unit nothing is logged


def test_a_stage_timing_says_how_much_of_it_was_paused() -> None:
    """Each wait at a checkpoint (here 50 ms) counts towards the stage it fell in, once
    however many of the stage's threads waited at the same time."""
    log, timer = PauseLog(), StageTimer()
    with yielding_to(lambda: time.sleep(0.05), log):
        with timer.stage("paused"):
            checkpoint()
            with ThreadPoolExecutor(2) as pool:  # two threads waiting side by side
                for future in [pool.submit(carry(checkpoint)) for _ in range(2)]:
                    future.result()
        with timer.stage("calm"):
            pass
        with yielding_to(None), timer.stage("urgent"):  # URGENT work on a paused thread
            checkpoint()
    assert set(timer.paused) == {"paused"}
    assert 0.1 <= timer.paused["paused"] <= timer.seconds["paused"]
    assert timer.paused["paused"] <= log.within() + 1e-9


def test_ingest_has_a_checkpoint_per_file_and_per_decoding_job(tmp_path: Path) -> None:
    files = make_ct_series(tmp_path, n_slices=6)
    calls: list[str] = []
    with yielding_to(lambda: calls.append(threading.current_thread().name)):
        headers = discover_series(tmp_path)
        assert calls and len(calls) >= len(files)  # one per file read
        calls.clear()
        load_series(headers[0], workers=2)
    assert len(calls) >= len(files)  # one per decoding job, on the decoding threads
    assert threading.current_thread().name not in calls
