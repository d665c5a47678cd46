"""Job-status answers kept per published view in a reader process
(radserve.api.status_bodies): reused while the job's view is the same object and its
``deadline_missed`` unchanged, rebuilt when the job changes (a new snapshot) or passes
its deadline. Fake clock; real snapshot file, real store and the real reader app."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.records import T0, job_record

from radserve.api.job_snapshot import SnapshotReader, SnapshotWriter
from radserve.api.reader import reader_app
from radserve.api.schemas import JobOut
from radserve.api.status_bodies import StatusBodies
from radserve.config import load_settings
from radserve.domain.jobs import JobState
from radserve.domain.priority import PriorityClass
from radserve.service.jobcache import JobCache
from radserve.service.jobs import JobAccess, JobView
from radserve.store import JobRecord, Store, init_store


def _job(state: JobState, *, updated_s: int = 0, finished: dt.datetime | None = None) -> JobRecord:
    return job_record(
        state=state,
        priority_class=PriorityClass.URGENT,
        deadline=T0 + dt.timedelta(minutes=30),
        pipeline_name="ct-organs",
        started=T0 + dt.timedelta(seconds=5) if state is not JobState.QUEUED else None,
        finished=finished,
        updated=T0 + dt.timedelta(seconds=updated_s),
        result_path="/nowhere/result" if state is JobState.SUCCEEDED else None,
    )


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def test_the_same_view_is_answered_from_one_body_until_the_job_changes() -> None:
    clock = Clock(T0 + dt.timedelta(minutes=1))
    bodies = StatusBodies(clock)
    running = JobView(_job(JobState.RUNNING), None)
    first = bodies.body(running)
    assert bodies.body(running) is first and bodies.built == 1  # polled again: reused
    assert first == JobOut.of(running, now=clock.now).model_dump_json().encode()
    assert json.loads(first)["state"] == "running"

    done = JobView(_job(JobState.SUCCEEDED, finished=T0 + dt.timedelta(minutes=2)), None)
    answer = json.loads(bodies.body(done))  # a new view (the next snapshot): rebuilt
    assert answer["state"] == "succeeded" and "report" in answer["links"]
    assert bodies.built == 2

    # a view equal to the kept one but not the same object (a reloaded snapshot): rebuilt
    kept = bodies.body(done)
    assert bodies.body(dataclasses.replace(done)) == kept and bodies.built == 3


def test_an_unfinished_job_passing_its_deadline_is_answered_as_missed() -> None:
    clock = Clock(T0 + dt.timedelta(minutes=29))
    bodies = StatusBodies(clock)
    queued = JobView(_job(JobState.QUEUED), 3)
    assert json.loads(bodies.body(queued))["deadline_missed"] is False
    clock.now = T0 + dt.timedelta(minutes=31)  # the same view, past the deadline
    again = json.loads(bodies.body(queued))
    assert again["deadline_missed"] is True and again["queue_position"] == 3
    assert bodies.built == 2
    assert json.loads(bodies.body(queued))["deadline_missed"] is True
    assert bodies.built == 2  # missed stays missed: kept again


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


async def _never(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a keyed status read must not be forwarded")


def test_a_reader_answers_the_new_state_once_the_snapshot_changes(
    tmp_path: Path, store: Store
) -> None:
    """The serving process publishes running, then succeeded; the reader's answer follows
    (its cached body is not served for the newer view)."""
    cache = JobCache()
    publisher = SnapshotWriter(
        JobAccess(store, cache, scheduler=None, hooks=None),  # type: ignore[arg-type]
        cache,
        tmp_path / "jobs.snapshot",
    )
    settings = load_settings(None, data_dir=tmp_path / "data")
    app = reader_app(
        settings,
        store,
        SnapshotReader(tmp_path / "jobs.snapshot", recheck_s=0.0),
        _never,
        lambda event: None,
    )
    _, key = store.create_api_key(name="poller", role="read")

    async def states() -> list[str]:
        transport = httpx.ASGITransport(app=app)
        seen = []
        async with httpx.AsyncClient(transport=transport, base_url="http://reader") as client:
            for record in (
                _job(JobState.RUNNING, updated_s=1),
                _job(JobState.SUCCEEDED, updated_s=2, finished=T0 + dt.timedelta(minutes=2)),
            ):
                cache.put(record)
                publisher.write()
                for _ in range(3):  # polled: the same answer each time
                    r = await client.get("/v1/jobs/job-1", headers={"X-API-Key": key})
                    assert r.status_code == 200, r.text
                    seen.append(r.json()["state"])
        return seen

    assert asyncio.run(states()) == ["running"] * 3 + ["succeeded"] * 3
