"""Store: jobs, state machine, exactly-once results, cache, listing, restart recovery.

Every test here needs only a ``store`` fixture; tests/integration/test_store_postgres.py
runs this same module against PostgreSQL by providing its own ``store``.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radserve.store import (
    CacheKey,
    InvalidCursorError,
    InvalidTransitionError,
    JobNotFoundError,
    JobRecord,
    JobState,
    PriorityClass,
    ResultAlreadyRecordedError,
    Store,
    StoreError,
    init_store,
)

FP = "a" * 64
T0 = dt.datetime(2025, 3, 1, 8, 0, tzinfo=dt.UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def reopen(store: Store) -> Store:
    """A second Store on the same database, as a restarted process would open it."""
    return init_store(store.engine.url.render_as_string(hide_password=False))


def new_job(store: Store, **overrides: Any) -> JobRecord:
    fields: dict[str, Any] = {
        "priority_class": PriorityClass.OUTPATIENT,
        "deadline": dt.timedelta(seconds=1800),
        "pipeline_name": "ct-chest-abdomen",
        "pipeline_version": "1.0",
        "precision": "fp32",
        "fingerprint": FP,
        "study_path": "studies/aa/" + FP,
        "model_versions": {"organs": "1.0", "lesions": "1.0"},
    }
    fields.update(overrides)
    return store.create_job(**fields)


def walk(store: Store, job_id: str, *states: str) -> JobRecord:
    record = store.get_job(job_id)
    for state in states:
        record = store.transition(job_id, state)
    return record


def key(**overrides: Any) -> CacheKey:
    fields: dict[str, Any] = {
        "fingerprint": FP,
        "pipeline_name": "ct-chest-abdomen",
        "pipeline_version": "1.0",
        "model_versions": {"organs": "1.0", "lesions": "1.0"},
        "precision": "fp32",
    }
    fields.update(overrides)
    return CacheKey(**fields)


def test_created_job_is_committed_and_visible_to_another_connection(store: Store) -> None:
    job = new_job(store, arrival=T0, api_key_id="k1", client_address="10.0.0.5")
    other = reopen(store)
    try:
        again = other.get_job(job.id)
    finally:
        other.close()
    assert again == job
    assert again.state == JobState.RECEIVED
    assert again.deadline == T0 + dt.timedelta(seconds=1800)
    assert again.arrival.tzinfo is not None
    assert again.model_versions == {"organs": "1.0", "lesions": "1.0"}


def test_get_unknown_job_raises(store: Store) -> None:
    with pytest.raises(JobNotFoundError, match="no job with id 'nope'"):
        store.get_job("nope")


def test_duplicate_job_id_is_refused(store: Store) -> None:
    new_job(store, job_id="j1")
    with pytest.raises(StoreError, match="exists already"):
        new_job(store, job_id="j1")


@pytest.mark.parametrize(
    "path",
    [
        ("queued", "running", "failed"),
        ("queued", "running", "cancelled"),
        ("queued", "running", "queued", "running"),
        ("queued", "cancelled"),
        ("queued", "failed"),
        ("cancelled",),
        ("failed",),
    ],
)
def test_allowed_transitions(store: Store, path: tuple[str, ...]) -> None:
    job = walk(store, new_job(store).id, *path)
    assert job.state == JobState(path[-1])
    assert job.attempts == path.count("running")


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ((), "running"),
        ((), "received"),
        (("queued",), "queued"),
        (("queued", "running"), "received"),
        (("failed",), "queued"),
        (("cancelled",), "running"),
        (("queued", "running", "cancelled"), "failed"),
        (("queued", "running"), "succeeded"),
    ],
)
def test_forbidden_transitions_raise_and_change_nothing(
    store: Store, path: tuple[str, ...], target: str
) -> None:
    before = walk(store, new_job(store).id, *path)
    with pytest.raises(InvalidTransitionError, match=f"cannot become {target}|record_result"):
        store.transition(before.id, target)
    assert store.get_job(before.id) == before


def test_transition_of_unknown_job_raises(store: Store) -> None:
    with pytest.raises(JobNotFoundError):
        store.transition("nope", "queued")


def test_running_stamps_start_and_final_states_stamp_finish(store: Store) -> None:
    job = walk(store, new_job(store).id, "queued")
    assert job.started is None and job.finished is None
    running = store.transition(job.id, "running")
    assert running.started is not None and running.finished is None
    failed = store.transition(
        job.id,
        "failed",
        error_code="inference_failed",
        error_message="ONNX Runtime ran out of memory",
        stage_timings={"ingest": 0.5, "inference": 2.0},
    )
    assert failed.finished is not None and failed.finished >= running.started
    assert failed.error_code == "inference_failed"
    assert failed.stage_timings == {"ingest": 0.5, "inference": 2.0}


def test_transition_sets_queue_metadata_and_class(store: Store) -> None:
    job = new_job(store)
    queued = store.transition(
        job.id, "queued", queue_meta={"aged": True}, priority_class="INPATIENT"
    )
    assert queued.queue_meta == {"aged": True}
    assert queued.priority_class == PriorityClass.INPATIENT


def test_transition_rejects_fields_it_does_not_own(store: Store) -> None:
    job = new_job(store)
    with pytest.raises(TypeError, match="cannot set \\['result_path'\\]"):
        store.transition(job.id, "queued", result_path="/x")


def test_only_one_of_concurrent_claims_wins(store: Store) -> None:
    job = walk(store, new_job(store).id, "queued")
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def claim() -> None:
        barrier.wait()
        try:
            store.transition(job.id, "running")
            outcomes.append("won")
        except InvalidTransitionError:
            outcomes.append("lost")

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost", "lost", "lost", "won"]
    assert store.get_job(job.id).attempts == 1


def test_result_is_recorded_exactly_once(store: Store) -> None:
    job = walk(store, new_job(store).id, "queued", "running")
    done = store.record_result(job.id, "results/j1", key(), stage_timings={"total": 3.0})
    assert done.state == JobState.SUCCEEDED
    assert done.result_path == "results/j1" and done.finished is not None
    with pytest.raises(ResultAlreadyRecordedError) as info:
        store.record_result(job.id, "results/other", key())
    assert info.value.existing_result_path == "results/j1"
    assert store.get_job(job.id).result_path == "results/j1"


def test_result_needs_a_running_job(store: Store) -> None:
    queued = walk(store, new_job(store).id, "queued")
    with pytest.raises(InvalidTransitionError, match="is queued and cannot become succeeded"):
        store.record_result(queued.id, "results/x")
    cancelled = walk(store, new_job(store).id, "queued", "running", "cancelled")
    with pytest.raises(InvalidTransitionError, match="is cancelled"):
        store.record_result(cancelled.id, "results/y", key())
    assert store.get_job(cancelled.id).result_path is None
    assert store.find_cached_result(key()) is None


def test_cache_hit_needs_the_same_input_pipeline_models_and_precision(store: Store) -> None:
    job = walk(store, new_job(store).id, "queued", "running")
    store.record_result(job.id, "results/j", key())
    hit = store.find_cached_result(key(model_versions={"lesions": "1.0", "organs": "1.0"}))
    assert hit is not None and hit.id == job.id and hit.result_path == "results/j"
    for miss in (
        key(fingerprint="b" * 64),
        key(pipeline_version="1.1"),
        key(pipeline_name="other"),
        key(model_versions={"organs": "1.0", "lesions": "2.0"}),
        key(precision="fp16"),
    ):
        assert store.find_cached_result(miss) is None


def test_cache_keeps_the_first_result_for_a_key(store: Store) -> None:
    first = walk(store, new_job(store).id, "queued", "running")
    second = walk(store, new_job(store).id, "queued", "running")
    store.record_result(first.id, "results/first", key())
    done = store.record_result(second.id, "results/second", key())
    assert done.result_path == "results/second"
    cached = store.find_cached_result(key())
    assert cached is not None and cached.id == first.id


def test_cache_key_must_describe_the_jobs_input(store: Store) -> None:
    job = walk(store, new_job(store).id, "queued", "running")
    with pytest.raises(StoreError, match="fingerprint is not the job's input"):
        store.record_result(job.id, "results/j", key(fingerprint="b" * 64))
    assert store.get_job(job.id).state == JobState.RUNNING


def test_cache_hit_job_is_born_succeeded_with_the_cached_result(store: Store) -> None:
    source = walk(store, new_job(store).id, "queued", "running")
    store.record_result(source.id, "results/src", key())
    hit = new_job(store, cached_from=source.id)
    assert hit.state == JobState.SUCCEEDED
    assert hit.result_path == "results/src" and hit.cached_from == source.id
    pending = new_job(store)
    with pytest.raises(InvalidTransitionError, match="has no result to reuse"):
        new_job(store, cached_from=pending.id)


def test_list_jobs_filters(store: Store) -> None:
    a = new_job(store, arrival=T0, priority_class="URGENT")
    b = new_job(store, arrival=T0 + dt.timedelta(minutes=1), pipeline_name="mr-brain")
    c = walk(store, new_job(store, arrival=T0 + dt.timedelta(minutes=2)).id, "queued")

    def ids(**filters: Any) -> list[str]:
        return [j.id for j in store.list_jobs(**filters).items]

    assert ids() == [c.id, b.id, a.id]
    assert ids(state="queued") == [c.id]
    assert ids(state=["queued", JobState.RECEIVED]) == [c.id, b.id, a.id]
    assert ids(priority_class=PriorityClass.URGENT) == [a.id]
    assert ids(pipeline="mr-brain") == [b.id]
    assert ids(created_after=T0 + dt.timedelta(minutes=1)) == [c.id, b.id]
    assert ids(created_before=T0 + dt.timedelta(minutes=1)) == [a.id]


def test_list_jobs_cursor_visits_every_job_once_newest_first(store: Store) -> None:
    # three jobs share an arrival time: the id breaks the tie, so no page skips one
    arrivals = [T0] * 3 + [T0 + dt.timedelta(seconds=s) for s in range(1, 5)]
    created = [new_job(store, arrival=t) for t in arrivals]
    seen: list[JobRecord] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = store.list_jobs(limit=3, cursor=cursor)
        seen.extend(page.items)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 3
    assert sorted(j.id for j in seen) == sorted(j.id for j in created)
    keys = [(j.arrival, j.id) for j in seen]
    assert keys == sorted(keys, reverse=True)


def test_list_jobs_rejects_bad_cursor_and_limit(store: Store) -> None:
    with pytest.raises(InvalidCursorError):
        store.list_jobs(cursor="not-a-cursor")
    with pytest.raises(ValueError, match="limit must be in"):
        store.list_jobs(limit=0)


def test_restart_recovery_requeues_interrupted_jobs(store: Store) -> None:
    received = new_job(store, deadline=T0 + dt.timedelta(minutes=3))
    queued = walk(store, new_job(store, deadline=T0 + dt.timedelta(minutes=2)).id, "queued")
    running = walk(
        store, new_job(store, deadline=T0 + dt.timedelta(minutes=1)).id, "queued", "running"
    )
    finished = walk(store, new_job(store).id, "queued", "running", "failed")
    cancelled = walk(store, new_job(store).id, "cancelled")
    assert [j.id for j in store.unfinished_jobs()] == [running.id, queued.id, received.id]

    restarted = reopen(store)  # as after a crash: a new process opens the same database
    try:
        recovered = restarted.requeue_unfinished()
        assert [j.id for j in recovered] == [running.id, queued.id, received.id]
        assert {j.state for j in recovered} == {JobState.QUEUED}
        assert recovered[0].attempts == 1  # the interrupted attempt still counts
        assert restarted.get_job(finished.id).state == JobState.FAILED
        assert restarted.get_job(cancelled.id).state == JobState.CANCELLED
        assert restarted.requeue_unfinished() == recovered  # idempotent
        audit = list(restarted.iter_audit())
        started = [r.subject for r in audit if r.action == "job.started"]
        assert sorted(started) == sorted([running.id, finished.id])  # each run audited
        requeued = [(r.subject, r.payload) for r in audit if r.action == "job.requeued"]
        first = {subject: payload for subject, payload in requeued[:3]}
        assert {s: p["previous_state"] for s, p in first.items()} == {
            running.id: "running",
            queued.id: "queued",
            received.id: "received",
        }
        assert all(
            p["reason"] == "restart_recovery" and p["state"] == "queued" for p in first.values()
        )
        assert len(requeued) == 6  # the second recovery resumed (and audited) them again
        assert restarted.verify_audit().ok
    finally:
        restarted.close()


def test_ping(store: Store) -> None:
    assert store.ping()
