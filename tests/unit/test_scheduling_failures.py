"""Admission control, retries, circuit breakers, timeouts and cancellation."""

from __future__ import annotations

import pytest
from tests.factories.scheduling_fakes import FakeSession, FakeTask, RecordingHooks, fake_work

from radserve.config import JobSettings, SchedulerSettings
from radserve.errors import DeviceMemoryError, InferenceError, ModelError, StudyError
from radserve.scheduling import (
    BatchDispatch,
    FakeClock,
    JobRequest,
    JobState,
    ModelKey,
    ModelUnavailableError,
    PriorityClass,
    QueueFullError,
    Scheduler,
    execute,
    run_serial,
)
from radserve.service.metrics import Metrics
from radserve.service.service import Readiness
from radserve.store import LeaseLostError
from radserve.store.errors import DatabaseUnavailableError

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT


def _until_batch(scheduler: Scheduler) -> BatchDispatch:
    """Run CPU work until a device batch is handed out; return it without running it."""
    while True:
        d = scheduler.next_dispatch("gpu0") or scheduler.next_cpu_dispatch()
        assert d is not None, "no device batch came"
        if isinstance(d, BatchDispatch):
            return d
        scheduler.complete(d, execute(d))


def _state(hooks: RecordingHooks, job_id: str) -> tuple[JobState, str | None] | None:
    final = hooks.final(job_id)
    return None if final is None else (final.state, final.error_code)


# --- admission ----------------------------------------------------------------------------
def test_routine_refused_when_full_urgent_never() -> None:
    config = SchedulerSettings(queue_limits={"outpatient": 2, "inpatient": 1})
    scheduler = Scheduler(config, clock=FakeClock())
    session = FakeSession()
    for n in range(2):
        scheduler.submit(JobRequest(f"o{n}", fake_work(session, 1), OUT))
    with pytest.raises(
        QueueFullError, match=r"outpatient queue is full \(2 studies waiting"
    ) as err:
        scheduler.submit(JobRequest("o2", fake_work(session, 1), OUT))
    assert err.value.retry_after == config.default_retry_after_s
    assert err.value.code == "queue_full" and err.value.retryable
    scheduler.submit(JobRequest("i0", fake_work(session, 1), INP))
    with pytest.raises(QueueFullError, match="inpatient queue is full"):
        scheduler.submit(JobRequest("i1", fake_work(session, 1), INP))
    for n in range(50):
        assert scheduler.submit(JobRequest(f"u{n}", fake_work(session, 1), URG)).cls is URG
    # Admitted before a restart: resubmitted, never refused, keeps its original deadline.
    ticket = scheduler.submit(JobRequest("o2", fake_work(session, 1), OUT, age_s=60, resume=True))
    assert ticket.deadline == pytest.approx(1800 - 60)
    assert scheduler.snapshot().queued == {URG: 50, INP: 1, OUT: 3}


def test_retry_after_follows_observed_run_times() -> None:
    clock = FakeClock()
    config = SchedulerSettings(queue_limits={"outpatient": 1})
    scheduler = Scheduler(config, clock=clock)
    scheduler.submit(JobRequest("first", fake_work(FakeSession(clock, seconds_per_call=5), 2), OUT))
    run_serial(scheduler)  # ran 10 s
    scheduler.submit(JobRequest("a", fake_work(FakeSession(), 1), OUT))
    with pytest.raises(QueueFullError) as err:
        scheduler.submit(JobRequest("b", fake_work(FakeSession(), 1), OUT))
    assert err.value.retry_after == 10


# --- retries and failures ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("errors", "expected", "retries"),
    [
        ([InferenceError("device hiccup")], (JobState.SUCCEEDED, None), 1),
        ([InferenceError("x")] * 3, (JobState.FAILED, "inference_failed"), 2),
        ([ModelError("bad output")], (JobState.FAILED, "model_invalid"), 0),
        ([RuntimeError("boom")], (JobState.FAILED, "internal_error"), 0),
    ],
)
def test_device_errors_retried_only_when_retryable(
    errors: list[Exception], expected: tuple[JobState, str | None], retries: int
) -> None:
    hooks = RecordingHooks()
    config = SchedulerSettings(breaker_threshold=10)
    jobs = JobSettings(max_retries=2, retry_backoff_s=0)
    scheduler = Scheduler(config, jobs=jobs, clock=FakeClock(), hooks=hooks)
    session = FakeSession()
    session.errors = list(errors)
    work = fake_work(session, 2)
    scheduler.submit(JobRequest("j", work, OUT))
    run_serial(scheduler)
    assert _state(hooks, "j") == expected
    assert hooks.final("j").retries == retries  # type: ignore[union-attr]
    if expected[0] is JobState.SUCCEEDED:
        assert work.steps[0].task.accepted == [0, 1]  # the failed batch ran again, once
        assert work.log == ["ingest", "report"]


def test_a_retry_waits_retry_backoff_s_while_other_jobs_run() -> None:
    """``jobs.retry_backoff_s`` (a setting once read by nothing) delays the retry; the
    job gets no work meanwhile, other jobs do."""
    clock, hooks = FakeClock(), RecordingHooks()
    config = SchedulerSettings(urgent_exclusive=False)
    jobs = JobSettings(max_retries=2, retry_backoff_s=5)
    scheduler = Scheduler(config, jobs=jobs, clock=clock, hooks=hooks)
    flaky = FakeSession()
    flaky.errors = [InferenceError("CUDA out of memory")]
    scheduler.submit(JobRequest("flaky", fake_work(flaky, 1), URG))
    run_serial(scheduler)
    assert hooks.final("flaky") is None and len(flaky.calls) == 1  # backing off
    other = FakeSession()
    scheduler.submit(JobRequest("other", fake_work(other, 1, model=ModelKey("b", "1")), OUT))
    run_serial(scheduler)
    assert _state(hooks, "other") == (JobState.SUCCEEDED, None)
    clock.advance(4.9)
    assert run_serial(scheduler) == 0 and len(flaky.calls) == 1
    clock.advance(0.2)
    run_serial(scheduler)
    assert _state(hooks, "flaky") == (JobState.SUCCEEDED, None)
    assert len(flaky.calls) == 2 and hooks.final("flaky").retries == 1  # type: ignore[union-attr]


def test_a_database_outage_is_waited_out_without_using_up_retries() -> None:
    """A stage that needs the database while it is away (``outage`` errors) is tried
    again after the back-off for as long as the outage lasts, and does not count as one
    of the job's retries; the job timeout still bounds it."""
    clock, hooks = FakeClock(), RecordingHooks()
    jobs = JobSettings(max_retries=1, retry_backoff_s=5, timeout_s=60)
    scheduler = Scheduler(jobs=jobs, clock=clock, hooks=hooks)
    waits = fake_work(FakeSession(), 1)
    waits.cpu_errors = [DatabaseUnavailableError("database unavailable")] * 4
    scheduler.submit(JobRequest("waits", waits, OUT))
    for _ in range(4):  # four outages in a row: more than max_retries
        run_serial(scheduler)
        assert hooks.final("waits") is None
        clock.advance(5.1)
    run_serial(scheduler)
    final = hooks.final("waits")
    assert final is not None and (final.state, final.retries) == (JobState.SUCCEEDED, 0)

    endless = fake_work(FakeSession(), 1)
    endless.cpu_errors = [DatabaseUnavailableError("database unavailable")] * 100
    scheduler.submit(JobRequest("endless", endless, OUT))
    for _ in range(14):
        run_serial(scheduler)
        clock.advance(5.1)
        scheduler.tick()
    assert _state(hooks, "endless") == (JobState.FAILED, "job_timeout")


def test_prepare_and_cpu_stage_errors() -> None:
    hooks = RecordingHooks()
    scheduler = Scheduler(jobs=JobSettings(retry_backoff_s=0), clock=FakeClock(), hooks=hooks)
    session = FakeSession()
    flaky = fake_work(session, 2)
    flaky.steps[0].task = FakeTask(2, prepare_errors=[InferenceError("transient")])
    bad_study = fake_work(session, 2)
    bad_study.cpu_errors = [StudyError("slices do not form one volume")]
    scheduler.submit(JobRequest("flaky", flaky, OUT))
    scheduler.submit(JobRequest("bad", bad_study, OUT))
    run_serial(scheduler)
    assert _state(hooks, "flaky") == (JobState.SUCCEEDED, None)
    final = hooks.final("bad")
    assert final is not None and (final.state, final.error_code) == (
        JobState.FAILED,
        "study_invalid",
    )
    assert final.error_message == "slices do not form one volume"
    assert session.calls == [2, 2]  # the bad study never reached the device


# --- circuit breaker --------------------------------------------------------------------
def test_breaker_opens_after_n_failures_and_reset_closes_it() -> None:
    hooks = RecordingHooks()
    config = SchedulerSettings(breaker_threshold=2, max_running=1)
    scheduler = Scheduler(config, jobs=JobSettings(max_retries=0), clock=FakeClock(), hooks=hooks)
    organs = FakeSession()
    organs.errors = [InferenceError("CUDA error"), InferenceError("CUDA error")]
    lesions = ModelKey("lesions", "1.0.0")
    for job_id in ("a", "b", "queued"):
        scheduler.submit(JobRequest(job_id, fake_work(organs, 1), OUT))
    scheduler.submit(JobRequest("other", fake_work(FakeSession(), 1, model=lesions), OUT))
    run_serial(scheduler)
    assert _state(hooks, "a") == (JobState.FAILED, "inference_failed")
    assert _state(hooks, "b") == (JobState.FAILED, "model_unavailable")
    # Failed fast: it never started.
    assert _state(hooks, "queued") == (JobState.FAILED, "model_unavailable")
    assert [e.state for e in hooks.states if e.job_id == "queued"] == ["queued", "failed"]
    assert _state(hooks, "other") == (JobState.SUCCEEDED, None)
    assert scheduler.open_models() == ("organs",)
    assert scheduler.snapshot().open_models == ("organs",)
    with pytest.raises(ModelUnavailableError, match="model organs failed 2 times in a row"):
        scheduler.submit(JobRequest("c", fake_work(organs, 1), OUT))

    assert scheduler.reset_model("organs") and not scheduler.reset_model("organs")
    assert scheduler.open_models() == ()
    scheduler.submit(JobRequest("c", fake_work(organs, 1), OUT))
    run_serial(scheduler)
    assert _state(hooks, "c") == (JobState.SUCCEEDED, None)


def test_success_resets_the_failure_count() -> None:
    config = SchedulerSettings(breaker_threshold=2)
    scheduler = Scheduler(config, jobs=JobSettings(max_retries=0), clock=FakeClock())
    session = FakeSession()
    for n in range(4):  # fail, succeed, fail, succeed: never two in a row
        session.errors = [InferenceError("x")] if n % 2 == 0 else []
        scheduler.submit(JobRequest(f"j{n}", fake_work(session, 1), OUT))
        run_serial(scheduler)
    assert scheduler.open_models() == ()


# --- timeout and cancellation -----------------------------------------------------------
def test_job_timeout_stops_it_at_the_next_batch_boundary() -> None:
    clock = FakeClock()
    hooks = RecordingHooks()
    scheduler = Scheduler(jobs=JobSettings(timeout_s=5), clock=clock, hooks=hooks)
    work = fake_work(FakeSession(), 3)
    scheduler.submit(JobRequest("j", work, OUT))
    batch = _until_batch(scheduler)
    clock.advance(6)
    scheduler.tick()
    assert hooks.final("j") is None  # its batch is still on the device
    scheduler.complete(batch, execute(batch))
    final = hooks.final("j")
    assert final is not None and final.error_code == "job_timeout"
    assert "over the 5 s job timeout" in (final.error_message or "")
    assert run_serial(scheduler) == 0 and work.steps[0].task.accepted == []


def test_cancel_running_job_at_batch_boundary_others_continue() -> None:
    hooks = RecordingHooks()
    scheduler = Scheduler(clock=FakeClock(), hooks=hooks)
    session = FakeSession()
    victim = fake_work(session, 5)
    scheduler.submit(JobRequest("victim", victim, INP))
    scheduler.submit(JobRequest("other", fake_work(session, 2), OUT))
    first = _until_batch(scheduler)
    scheduler.complete(first, execute(first))
    running = _until_batch(scheduler)  # victim's next batch is on the device
    assert [p.job_id for p in running.parts] == ["victim"]
    assert scheduler.cancel("victim")
    assert not scheduler.cancel("victim")  # already on its way out
    assert hooks.final("victim") is None
    scheduler.complete(running, execute(running))
    final = hooks.final("victim")
    assert final is not None and (final.state, final.error_code) == (
        JobState.CANCELLED,
        "job_cancelled",
    )
    run_serial(scheduler)
    assert victim.steps[0].task.accepted == [0]  # the batch in flight was discarded
    assert victim.log == ["ingest"]  # no report
    assert _state(hooks, "other") == (JobState.SUCCEEDED, None)
    assert scheduler.idle


def test_cancel_waiting_job_is_immediate() -> None:
    hooks = RecordingHooks()
    scheduler = Scheduler(clock=FakeClock(), hooks=hooks)
    scheduler.submit(JobRequest("j", fake_work(FakeSession(), 1), OUT))
    assert scheduler.cancel("j")
    assert _state(hooks, "j") == (JobState.CANCELLED, "job_cancelled")
    assert not scheduler.cancel("j") and not scheduler.cancel("unknown")
    assert scheduler.idle and scheduler.snapshot().deadline_misses[OUT] == 0


# --- a held scheduler (its server cannot prove its job leases) -----------------------------
def test_a_held_scheduler_hands_out_nothing_until_released() -> None:
    hooks = RecordingHooks()
    clock = FakeClock()
    scheduler = Scheduler(SchedulerSettings(), clock=clock, hooks=hooks)
    session = FakeSession()
    for name in ("kept", "lost"):
        scheduler.submit(JobRequest(name, fake_work(session, 2), OUT))
    first = scheduler.next_cpu_dispatch()
    assert first is not None  # a unit handed out before the hold runs to its end
    assert scheduler.snapshot().held is None and scheduler.snapshot().held_s == 0.0
    scheduler.hold("lease_unproven", "the job leases could not be renewed")
    clock.advance(5.0)
    scheduler.hold("lease_unproven", "the job leases could not be renewed")  # since kept
    held = scheduler.snapshot()  # what /metrics and /readyz show
    assert held.held is not None and held.held.reason == "lease_unproven"
    assert held.held_s == 5.0
    page = Metrics(scheduler.snapshot).exposition().decode()
    assert 'radserve_scheduler_held{reason="lease_unproven"} 1.0' in page
    assert "radserve_scheduler_held_seconds 5.0" in page
    ready = Readiness(False, True, True, (), held=held.held, held_s=held.held_s)
    assert ready.reasons == ["no new work starts, for 5 s now: the job leases could not be renewed"]
    assert scheduler.next_cpu_dispatch() is None and scheduler.next_dispatch("gpu0") is None
    scheduler.complete(first, execute(first))
    assert scheduler.next_cpu_dispatch() is None and scheduler.next_dispatch("gpu0") is None
    # the job another replica took over meanwhile is failed here, without running more
    assert scheduler.fail("lost", LeaseLostError("taken over"))
    assert _state(hooks, "lost") == (JobState.FAILED, "lease_lost")
    scheduler.release()
    assert scheduler.snapshot().held is None
    assert run_serial(scheduler, devices=("gpu0",)) > 0
    assert _state(hooks, "kept") == (JobState.SUCCEEDED, None)
    assert scheduler.unfinished() == set()


def test_an_unexpected_error_s_quoted_values_are_redacted_in_the_job() -> None:
    """``unexpected BadZipFile: Bad CRC-32 for file 'DOE^JOHN 19010203/1.dcm'`` was the
    job's error, shown to every reader of the job (trial, session 43)."""
    hooks = RecordingHooks()
    scheduler = Scheduler(
        SchedulerSettings(breaker_threshold=10),
        jobs=JobSettings(max_retries=0, retry_backoff_s=0),
        clock=FakeClock(),
        hooks=hooks,
    )
    session = FakeSession()
    session.errors = [RuntimeError("Bad CRC-32 for file 'DOE^JOHN 19010203/1.dcm'")]
    scheduler.submit(JobRequest("j", fake_work(session, 2), OUT))
    run_serial(scheduler)
    final = hooks.final("j")
    assert final is not None and final.error_code == "internal_error"
    assert final.error_message == (
        "unexpected RuntimeError: Bad CRC-32 for file '<redacted>' (a radserve defect; the "
        "server's log has the details under job j)"
    )


def test_out_of_device_memory_fails_the_job_but_opens_no_breaker() -> None:
    """A batch that does not fit even at one sample is the host's state: it counted as a
    model fault, and two such studies refused every later one (model_unavailable)."""
    hooks = RecordingHooks()
    config = SchedulerSettings(breaker_threshold=2, max_running=1)
    scheduler = Scheduler(config, jobs=JobSettings(max_retries=0), clock=FakeClock(), hooks=hooks)
    organs = FakeSession()
    organs.errors = [DeviceMemoryError("Failed to allocate 5242880000 bytes")] * 3
    for job_id in ("a", "b", "c"):
        scheduler.submit(JobRequest(job_id, fake_work(organs, 1), OUT))
    run_serial(scheduler)
    assert [_state(hooks, j) for j in "abc"] == [(JobState.FAILED, "inference_failed")] * 3
    assert scheduler.open_models() == ()
    scheduler.submit(JobRequest("d", fake_work(organs, 1), OUT))
    run_serial(scheduler)
    assert _state(hooks, "d") == (JobState.SUCCEEDED, None)
