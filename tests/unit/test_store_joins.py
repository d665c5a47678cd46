"""A second submission of an input whose job is unfinished joins that job
(:meth:`Store.create_or_join`): decided in the insert's transaction under a lock on the
input, so submissions racing from two stores on one database (two replicas) make one
job. On SQLite and PostgreSQL (skipped without ``RADSERVE_TEST_DATABASE_URL``)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.postgres import postgres_schema

from radserve.store import CacheKey, JobRecord, JobState, Store, init_store
from radserve.store.joins import JoinRule

FP = "f" * 64
MODELS = {"organs": "1.0.0"}
KEY = CacheKey(FP, "ct", "1", MODELS, "fp32")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'radserve.db'}"
        return
    with postgres_schema("radserve_joins") as schema_url:
        yield schema_url


def _fields(source: str = "api", key_id: str | None = "key-a", **extra: Any) -> dict[str, Any]:
    return {
        "job_id": str(uuid.uuid4()),
        "priority_class": "OUTPATIENT",
        "deadline": dt.timedelta(minutes=30),
        "pipeline_name": KEY.pipeline_name,
        "pipeline_version": KEY.pipeline_version,
        "precision": KEY.precision,
        "model_versions": MODELS,
        "fingerprint": FP,
        "study_path": "/data/studies/x",
        "api_key_id": key_id,
        "client_address": "127.0.0.1",
        "queue_meta": {"source": source},
        **extra,
    }


def _jobs(store: Store) -> list[JobRecord]:
    return list(store.list_jobs(limit=100).items)


def test_an_unfinished_job_of_the_same_input_and_route_answers_a_second_submission(
    url: str,
) -> None:
    store = init_store(url)
    try:
        first = store.create_job(**_fields())
        joined, was_joined = store.create_or_join(
            JoinRule(KEY, "api", audit_extra={"priority_class_asked": "URGENT"}),
            **_fields(key_id="key-a2"),
        )
        assert was_joined and joined.id == first.id
        assert [j.id for j in _jobs(store)] == [first.id]
        [record] = [r for r in store.iter_audit() if r.action == "job.joined"]
        assert (record.subject, record.actor_key_id) == (first.id, "key-a2")
        assert record.payload["priority_class_asked"] == "URGENT"

        # not joined: another route, a job the rule refuses (another site's), a model change
        other_route, joined_route = store.create_or_join(JoinRule(KEY, "dicomweb"), **_fields())
        refused, joined_refused = store.create_or_join(
            JoinRule(KEY, "api", lambda job: job.api_key_id != "key-a"), **_fields(key_id="b")
        )
        changed = CacheKey(FP, "ct", "1", {"organs": "1.1.0"}, "fp32")
        new_models, joined_models = store.create_or_join(
            JoinRule(changed, "api"), **_fields(model_versions={"organs": "1.1.0"})
        )
        assert (joined_route, joined_refused, joined_models) == (False, False, False)
        assert len({first.id, other_route.id, refused.id, new_models.id}) == 4

        # a finished job is not joined (the result cache answers succeeded ones)
        for job in _jobs(store):
            store.transition(job.id, JobState.CANCELLED)
        again, joined_again = store.create_or_join(JoinRule(KEY, "api"), **_fields())
        assert not joined_again and again.state is JobState.RECEIVED
    finally:
        store.close()


def test_submissions_racing_from_two_replicas_make_one_job(url: str) -> None:
    replicas = [init_store(url), init_store(url)]
    answers: list[tuple[str, bool]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def submit(store: Store) -> None:
        try:
            start.wait(30)
            record, joined = store.create_or_join(JoinRule(KEY, "api"), **_fields())
            answers.append((record.id, joined))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=submit, args=(replicas[i % 2],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        jobs = _jobs(replicas[0])
        assert len(jobs) == 1, jobs
        assert {job_id for job_id, _ in answers} == {jobs[0].id}
        assert sorted(joined for _, joined in answers) == [False] + [True] * 7
    finally:
        for store in replicas:
            store.close()
