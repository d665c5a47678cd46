"""The store's side of a duplicate submission beyond the joining insert
(:class:`radserve.store.joins.JoinMixin`), on SQLite and PostgreSQL (skipped without
``RADSERVE_TEST_DATABASE_URL``): a join that creates nothing (a full queue), a result
recorded since the submission's cache look-up, the accession pre-filter of a full
queue, a row's class raised only while it waits; and the upload's fingerprint read
before storing is the one the store gives it."""

from __future__ import annotations

import datetime as dt
import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.postgres import store_on

from radserve.domain.priority import PriorityClass
from radserve.service.upload_key import upload_fingerprint
from radserve.store import CacheKey, JobState, Store
from radserve.store.files import store_study
from radserve.store.joins import JoinRule

FP = "e" * 64
MODELS = {"organs": "1.0.0"}
KEY = CacheKey(FP, "ct", "1", MODELS, "fp32")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_join_answers") as opened:
        yield opened


def _fields(**extra: Any) -> dict[str, Any]:
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
        "api_key_id": "key-a",
        "queue_meta": {"source": "api"},
        "accession": "ACC7",
        **extra,
    }


def _succeed(store: Store, job_id: str) -> None:
    store.transition(job_id, JobState.QUEUED)
    store.transition(job_id, JobState.RUNNING)
    store.record_result(job_id, result_path=f"/data/results/{job_id}")


def test_a_join_that_may_not_create_takes_the_unfinished_job_or_nothing(store: Store) -> None:
    assert (
        store.join_unfinished(JoinRule(KEY, "api"), actor_key_id="b", client_address=None) is None
    )
    first = store.create_job(**_fields())
    joined = store.join_unfinished(JoinRule(KEY, "api"), actor_key_id="b", client_address="x")
    assert joined is not None and joined.id == first.id
    [record] = [r for r in store.iter_audit() if r.action == "job.joined"]
    assert (record.subject, record.actor_key_id) == (first.id, "b")
    assert [j.id for j in store.list_jobs(limit=10).items] == [first.id]


def test_a_result_recorded_since_the_cache_look_up_answers_instead_of_a_new_job(
    store: Store,
) -> None:
    first = store.create_job(**_fields())
    seen = store.results_for(KEY)  # the submission counts results, then looks in the cache
    _succeed(store, first.id)  # ... and the job succeeds before the locked insert
    found, answered = store.create_or_join(JoinRule(KEY, "api", results_seen=seen), **_fields())
    assert answered and (found.id, found.state) == (first.id, JobState.SUCCEEDED)
    assert [j.id for j in store.list_jobs(limit=10).items] == [first.id]
    assert not [r for r in store.iter_audit() if r.action == "job.joined"]
    # a result the submission knew of (it could not be sent its way) is no reason again
    again, joined = store.create_or_join(
        JoinRule(KEY, "api", results_seen=store.results_for(KEY)), **_fields()
    )
    assert not joined and again.state is JobState.RECEIVED


def test_only_an_accession_a_waiting_or_answered_job_has_may_be_a_duplicate(
    store: Store,
) -> None:
    assert store.accession_submitters("ACC7", "ct") == set()
    job = store.create_job(**_fields())
    store.create_job(**_fields(api_key_id="key-b"))
    assert store.accession_submitters("ACC7", "ct") == {"key-a", "key-b"}
    assert store.accession_submitters("ACC8", "ct") == set()
    assert store.accession_submitters("ACC7", "mr") == set()
    store.transition(job.id, JobState.CANCELLED)
    assert store.accession_submitters("ACC7", "ct") == {"key-b"}  # run again: a new job
    answered = store.create_job(**_fields(accession="ACC9"))
    _succeed(store, answered.id)
    assert store.accession_submitters("ACC9", "ct") == {"key-a"}  # the cache answers it
    # a waiting job whose number is not read yet (before revision 0020) may be anything
    store.create_job(**_fields(accession=None, api_key_id=None))
    assert store.accession_submitters("ACC8", "ct") == {None}


def test_a_row_is_raised_only_while_the_rule_holds_and_audited(store: Store) -> None:
    job = store.create_job(**_fields())
    deadline = job.arrival + dt.timedelta(minutes=5)

    def raise_to(cls: PriorityClass) -> Any:
        return store.refile_row(
            job.id,
            cls,
            deadline,
            when=lambda row: row.state is JobState.RECEIVED and cls.rank < row.priority_class.rank,
            actor_key_id="b",
            client_address=None,
            extra={"reason": "duplicate_submission"},
        )

    raised = raise_to(PriorityClass.URGENT)
    assert raised is not None and raised.priority_class is PriorityClass.URGENT
    assert raised.deadline == deadline
    assert raise_to(PriorityClass.INPATIENT) is None  # never lowered
    assert store.row_classes([job.id, "nope"]) == {
        job.id: (PriorityClass.URGENT, JobState.RECEIVED)
    }
    [record] = [r for r in store.iter_audit() if r.action == "job.reprioritised"]
    assert (record.actor_key_id, record.payload["reason"]) == ("b", "duplicate_submission")


def test_an_uploads_fingerprint_read_before_storing_is_the_stored_one(tmp_path: Path) -> None:
    bodies = [b"first instance", b"second", b"first instance"]  # a file sent twice counts once
    streams = [io.BytesIO(body) for body in bodies]
    streams[1].read(3)  # read from each stream's position, which is kept
    pairs = [(f"f{i}.dcm", s) for i, s in enumerate(streams)]
    before = upload_fingerprint(pairs)
    assert [s.tell() for s in streams] == [0, 3, 0]
    assert upload_fingerprint(pairs, max_bytes=10) is None
    assert before == store_study(tmp_path, pairs).fingerprint
