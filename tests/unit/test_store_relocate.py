"""Store.relocate: a folder moved back from the storage fallback takes every row with it
(job study and result paths, outbox files, nothing else -- not a sibling folder whose
name merely starts the same, nor one with LIKE wildcards in its name)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.postgres import postgres_schema
from tests.unit.test_store_jobs import new_job

from radserve.store import JobState, Store, init_store
from radserve.store.outbox import NewDelivery, OutboxKind, OutboxStore


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'radserve.db'}"
        else:
            url = stack.enter_context(postgres_schema("radserve_relocate"))
        s = init_store(url)
        yield s
        s.close()


def _delivery(job_id: str, path: str, uid: str) -> NewDelivery:
    return NewDelivery(
        destination="fhir",
        path=path,
        sop_class_uid="",
        sop_instance_uid=uid,
        study_instance_uid="1.2.3",
        transfer_syntax_uid="",
        job_id=job_id,
        kind=OutboxKind.FHIR,
    )


def test_rows_naming_a_folder_follow_it_and_no_others(store: Store) -> None:
    old, new = "/local/fallback/results/j_1%", "/shared/results/j_1%"
    moved = new_job(store, study_path="/local/fallback/studies/ab/x")
    other = new_job(store, study_path="/local/fallback/studies/ab/xy")
    for job in (moved, other):
        store.transition(job.id, JobState.QUEUED)
        store.transition(job.id, JobState.RUNNING)
    store.record_result(moved.id, old)
    store.record_result(other.id, "/local/fallback/results/j_10")
    outbox = OutboxStore(store.engine)
    outbox.add(
        [
            _delivery(moved.id, f"{old}/bundle.json", "b1"),
            _delivery(other.id, "/local/fallback/results/j_10/bundle.json", "b2"),
        ],
        now=dt.datetime.now(dt.UTC),
    )
    assert store.rows_naming(old) == [(moved.id, "succeeded")]

    assert store.relocate(old, new) == [moved.id]
    assert store.relocate("/local/fallback/studies/ab/x", "/shared/studies/ab/x") == [moved.id]
    assert store.get_job(moved.id).result_path == new
    assert store.get_job(moved.id).study_path == "/shared/studies/ab/x"
    assert store.get_job(other.id).result_path == "/local/fallback/results/j_10"
    assert store.get_job(other.id).study_path == "/local/fallback/studies/ab/xy"
    paths = {i.sop_instance_uid: i.path for i in outbox.items()}
    assert paths == {"b1": f"{new}/bundle.json", "b2": "/local/fallback/results/j_10/bundle.json"}
    assert store.rows_naming(old) == []
