"""Dynamic batching: studies on the same model version share a device call only when
their samples have the same shape; prepared batches stay bounded."""

from __future__ import annotations

from tests.factories.scheduling_fakes import FakeSession, RecordingHooks, fake_work

from radserve.config import SchedulerSettings
from radserve.scheduling import (
    BatchDispatch,
    FakeClock,
    JobRequest,
    ModelKey,
    PrepareDispatch,
    PriorityClass,
    Scheduler,
    StageDispatch,
    execute,
    run_serial,
)

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT


def _run_cpu(scheduler: Scheduler) -> None:
    """Run every CPU unit available (ingest, prepares) without touching the device."""
    while (d := scheduler.next_cpu_dispatch()) is not None:
        scheduler.complete(d, execute(d))


def _device_calls(scheduler: Scheduler) -> list[list[str]]:
    """Run everything; the job ids in each device call."""
    calls: list[list[str]] = []

    def record(d: object) -> None:
        if isinstance(d, BatchDispatch):
            calls.append([p.job_id for p in d.parts])

    _run_cpu(scheduler)
    run_serial(scheduler, on_dispatch=record)
    return calls


def test_two_studies_on_one_model_share_a_device_call() -> None:
    hooks = RecordingHooks()
    scheduler = Scheduler(clock=FakeClock(), hooks=hooks)
    session = FakeSession()
    a = fake_work(session, 1, base=0.0)
    b = fake_work(session, 1, base=100.0)
    scheduler.submit(JobRequest("a", a, OUT))
    scheduler.submit(JobRequest("b", b, OUT))
    assert _device_calls(scheduler) == [["a", "b"]]
    assert session.calls == [4]  # 2 + 2 samples in one call
    # Each study got its own part of the output back (FakeTask checks the values).
    assert a.steps[0].task.accepted == [0] and b.steps[0].task.accepted == [0]
    assert [(e.items, e.jobs) for e in hooks.batches] == [(4, 2)]
    assert {e.job_id for e in hooks.states if e.state.value == "succeeded"} == {"a", "b"}


def test_different_shapes_models_or_classes_do_not_mix() -> None:
    config = SchedulerSettings(urgent_exclusive=False)
    scheduler = Scheduler(config, clock=FakeClock())
    session = FakeSession()
    submit = scheduler.submit
    submit(JobRequest("small", fake_work(session, 1, item_shape=(1, 4, 4)), OUT))
    submit(JobRequest("large", fake_work(session, 1, item_shape=(1, 8, 8)), OUT))
    lesions = fake_work(FakeSession(), 1, model=ModelKey("lesions", "1.0.0"))
    submit(JobRequest("lesions", lesions, OUT))
    submit(JobRequest("inpatient", fake_work(session, 1, item_shape=(1, 8, 8)), INP))
    calls = _device_calls(scheduler)
    assert sorted(map(tuple, calls)) == [("inpatient",), ("large",), ("lesions",), ("small",)]
    assert calls[0] == ["inpatient"]


def test_mixed_batch_respects_max_batch_size() -> None:
    scheduler = Scheduler(SchedulerSettings(max_batch_size=4), clock=FakeClock())
    session = FakeSession()
    for job_id in ("a", "b", "c"):
        scheduler.submit(JobRequest(job_id, fake_work(session, 1, items=2), OUT))
    assert _device_calls(scheduler) == [["a", "b"], ["c"]]
    assert session.calls == [4, 2]


def test_routine_batch_waits_briefly_for_a_compatible_one_urgent_never() -> None:
    clock = FakeClock()
    config = SchedulerSettings(max_queue_delay_ms=10, urgent_exclusive=False)
    scheduler = Scheduler(config, clock=clock)
    session = FakeSession()
    scheduler.submit(JobRequest("a", fake_work(session, 1), OUT))
    scheduler.submit(JobRequest("b", fake_work(session, 1), OUT))
    units = [scheduler.next_cpu_dispatch() for _ in range(2)]  # both ingests
    for d in units:
        scheduler.complete(d, execute(d))  # type: ignore[arg-type]
    prep_a = scheduler.next_cpu_dispatch()
    prep_b = scheduler.next_cpu_dispatch()
    assert isinstance(prep_a, PrepareDispatch) and isinstance(prep_b, PrepareDispatch)
    scheduler.complete(prep_a, execute(prep_a))
    assert scheduler.next_dispatch("gpu0") is None  # b is being prepared: wait for it
    clock.advance(0.02)
    alone = scheduler.next_dispatch("gpu0")  # waited long enough
    assert alone is not None and [p.job_id for p in alone.parts] == ["a"]
    scheduler.complete(prep_b, execute(prep_b))
    scheduler.complete(alone, execute(alone))
    run_serial(scheduler)
    assert scheduler.idle

    # URGENT batches never wait.
    scheduler.submit(JobRequest("u1", fake_work(session, 1), URG))
    scheduler.submit(JobRequest("u2", fake_work(session, 1), URG))
    for _ in range(2):
        d = scheduler.next_cpu_dispatch()
        scheduler.complete(d, execute(d))  # type: ignore[arg-type]
    prep_u1, _prep_u2 = scheduler.next_cpu_dispatch(), scheduler.next_cpu_dispatch()
    scheduler.complete(prep_u1, execute(prep_u1))  # type: ignore[arg-type]
    urgent = scheduler.next_dispatch("gpu0")
    assert urgent is not None and [p.job_id for p in urgent.parts] == ["u1"]


def test_prepared_batches_are_bounded_but_a_higher_class_job_gets_through() -> None:
    config = SchedulerSettings(lookahead_batches=2, max_prepared_batches=4, urgent_exclusive=False)
    scheduler = Scheduler(config, clock=FakeClock())
    session = FakeSession()
    for job_id in ("a", "b", "c"):
        scheduler.submit(JobRequest(job_id, fake_work(session, 10), OUT))
    _run_cpu(scheduler)
    assert scheduler.snapshot().prepared_batches == 4
    scheduler.submit(JobRequest("in", fake_work(session, 10), INP))
    _run_cpu(scheduler)
    assert scheduler.snapshot().prepared_batches == 6  # 4 routine + the inpatient's 2
    first = scheduler.next_dispatch("gpu0")
    assert first is not None and {p.job_id for p in first.parts} == {"in"}


def test_feeding_the_device_goes_before_long_cpu_stages_within_a_class() -> None:
    scheduler = Scheduler(clock=FakeClock())
    session = FakeSession()
    scheduler.submit(JobRequest("a", fake_work(session, 2), OUT))
    scheduler.submit(JobRequest("b", fake_work(session, 2), OUT))
    ingest_a = scheduler.next_cpu_dispatch()
    assert isinstance(ingest_a, StageDispatch) and ingest_a.job_id == "a"
    scheduler.complete(ingest_a, execute(ingest_a))
    # a (better ranked) could prepare, b could start its ingest: the preparation wins.
    unit = scheduler.next_cpu_dispatch()
    assert isinstance(unit, PrepareDispatch) and unit.job_id == "a"
    # A feeder thread never takes a CPU stage, nor starts a job.
    assert scheduler.next_cpu_dispatch(feed_only=True) is None  # a is being prepared
    assert scheduler.job_info("b").state.value == "queued"  # type: ignore[union-attr]
    assert isinstance(scheduler.next_cpu_dispatch(), StageDispatch)  # b's ingest


def test_urgent_lane_takes_only_urgent_work() -> None:
    scheduler = Scheduler(SchedulerSettings(urgent_exclusive=False), clock=FakeClock())
    session = FakeSession()
    scheduler.submit(JobRequest("routine", fake_work(session, 2), OUT))
    assert scheduler.next_cpu_dispatch(urgent_only=True) is None
    scheduler.submit(JobRequest("er", fake_work(session, 2), URG))
    unit = scheduler.next_cpu_dispatch(urgent_only=True)
    assert isinstance(unit, StageDispatch) and unit.job_id == "er"
