"""A more urgent duplicate of a job that waits on another replica raises that job, through
two real servers sharing one database (SQLite file, PostgreSQL schema).

Before, the raise re-filed only this replica's own queue: an URGENT re-send of a study
whose OUTPATIENT job waited on the other replica got a job of its own (the study ran
twice). Now its row is raised (audited ``job.reprioritised``, ``reason:
duplicate_submission``) and the replica whose queue holds the job files it under the
row's class at its next look (``jobs.lease_poll_s``: radserve.service.row_classes)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.factories.service import ServerThread, auth, make_study, settings_for, upload, wait_job
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.domain.jobs import JobState as RunState
from radserve.domain.priority import PriorityClass
from radserve.scheduling.jobs import JobEvent
from radserve.service import Service
from radserve.service.row_classes import STARTED_REASON

pytestmark = pytest.mark.slow

NAMES = ("replica-a", "replica-b")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_postgres)])
def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        if request.param == "postgres":
            url = stack.enter_context(postgres_schema("radserve_dup_replicas"))
        else:
            url = f"sqlite:///{tmp_path / 'radserve.db'}"
        services = [
            Service(
                settings_for(
                    tmp_path / name,
                    database_url=url,
                    data_dir=str(tmp_path / "data"),  # replicas share one data folder
                    outbox__replicas=2,
                    outbox__instance_id=name,
                    jobs__lease_poll_s=0.2,
                    # replicas of one chain share its key (each folder's own: refused)
                    audit__key_file=tmp_path / "audit.key",
                )
            )
            for name in NAMES
        ]
        clients = []
        for service in services:
            srv = stack.enter_context(ServerThread(create_app(service)))
            clients.append(stack.enter_context(httpx.Client(base_url=srv.url, timeout=120)))
        for service in services:
            assert service.wait_warm(60 * WAIT_SCALE)
        record, key = services[0].store.create_api_key(name="ris", role="submit")
        yield {
            "services": services,
            "clients": clients,
            "key": key,
            "key_id": record.id,
            "root": tmp_path,
        }


def _submit(c: httpx.Client, files: list[Any], token: str, priority: str) -> httpx.Response:
    return c.post(f"/v1/studies?priority={priority}", files=files, headers=auth(token))


def test_an_urgent_duplicate_raises_the_job_waiting_on_another_replica(
    replicas: dict[str, Any],
) -> None:
    (a, b), (ca, cb), key = replicas["services"], replicas["clients"], replicas["key"]
    files = upload(make_study(replicas["root"] / "study"))
    a.scheduler.hold("test", "the job waits on replica A")
    try:
        first = _submit(ca, files, key, "outpatient")
        assert first.status_code == 202, first.text
        job_id = first.json()["id"]

        urgent = _submit(cb, files, key, "urgent")
        assert urgent.status_code == 202, urgent.text
        assert (urgent.json()["id"], urgent.json()["priority_class"]) == (job_id, "URGENT")
        assert b.scheduler.unfinished() == set()  # B runs nothing of it
        row = b.store.get_job(job_id)
        assert row.priority_class is PriorityClass.URGENT
        tat = b.scheduler.config.tat(PriorityClass.URGENT)
        assert row.deadline - row.arrival == dt.timedelta(seconds=tat)

        # A's queue follows the row at its next look, and A's API says so
        def filed_urgent() -> bool:
            info = a.scheduler.job_info(job_id)
            return info is not None and info.cls is PriorityClass.URGENT

        until(filed_urgent, "replica A to file the job as URGENT", 30)
        shown = ca.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
        assert shown["priority_class"] == "URGENT"

        records = [r for r in a.store.iter_audit() if r.subject == job_id]
        [joined] = [r for r in records if r.action == "job.joined"]
        assert joined.payload["priority_class_asked"] == "URGENT"
        [raised] = [r for r in records if r.action == "job.reprioritised"]
        assert raised.actor_key_id == replicas["key_id"]
        assert raised.payload["reason"] == "duplicate_submission"
        assert (raised.payload["old_priority_class"], raised.payload["new_priority_class"]) == (
            "OUTPATIENT",
            "URGENT",
        )
        assert [j.id for j in a.store.list_jobs(limit=20).items] == [job_id]
    finally:
        a.scheduler.release()
    assert wait_job(ca, job_id, key, timeout=300 * WAIT_SCALE)["state"] == "succeeded"


class _HoldOnStart:
    """A follower of replica A's scheduler: holds its work once the job has started, so
    the job stays started and unfinished until the test releases it."""

    def __init__(self, service: Service) -> None:
        self.scheduler = service.scheduler

    def on_state(self, event: JobEvent) -> None:
        if event.state is RunState.RUNNING:
            self.scheduler.hold("test", "the started job stays unfinished")

    def on_deadline_miss(self, miss: object) -> None:
        pass

    def on_batch(self, event: object) -> None:
        pass


def test_a_job_that_started_before_its_replica_looked_gets_its_row_set_back(
    replicas: dict[str, Any],
) -> None:
    """The row said waiting when another replica raised it, but the job had started
    here under its old class before this replica looked: the row is set back to what it
    runs as, audited, rather than name a class the job does not run under."""
    (a, _), (ca, _), key = replicas["services"], replicas["clients"], replicas["key"]
    files = upload(make_study(replicas["root"] / "study"))
    a.row_classes.stop()  # its look is made by the test, once the job runs
    a.scheduler.hold("test", "the job waits on replica A")
    first = _submit(ca, files, key, "outpatient")
    assert first.status_code == 202, first.text
    job_id = first.json()["id"]
    # replica B's raise, made while the row said queued
    row = a.store.get_job(job_id)
    deadline = row.arrival + dt.timedelta(seconds=a.scheduler.config.tat(PriorityClass.URGENT))
    a.store.refile_row(
        job_id,
        PriorityClass.URGENT,
        deadline,
        when=lambda job: True,
        actor_key_id=replicas["key_id"],
        client_address=None,
        extra={"reason": "duplicate_submission"},
    )
    a.hooks.followers.append(_HoldOnStart(a))
    a.scheduler.release()
    until(lambda: a.scheduler.held is not None, "the job to start on replica A", 60)
    info = a.scheduler.job_info(job_id)
    assert info is not None and info.state is RunState.RUNNING
    assert info.cls is PriorityClass.OUTPATIENT

    assert a.row_classes.sweep() == 1
    back = a.store.get_job(job_id)
    assert back.priority_class is PriorityClass.OUTPATIENT
    tat = a.scheduler.config.tat(PriorityClass.OUTPATIENT)
    assert back.deadline - back.arrival == dt.timedelta(seconds=tat)
    [record] = [
        r
        for r in a.store.iter_audit()
        if r.subject == job_id and r.payload.get("reason") == STARTED_REASON
    ]
    assert record.action == "job.reprioritised"
    assert (record.payload["old_priority_class"], record.payload["new_priority_class"]) == (
        "URGENT",
        "OUTPATIENT",
    )
    assert a.row_classes.sweep() == 0  # row and queue agree now

    a.hooks.followers.pop()
    a.scheduler.release()
    assert wait_job(ca, job_id, key, timeout=300 * WAIT_SCALE)["state"] == "succeeded"


def test_an_operator_re_prioritises_a_job_waiting_on_another_replica(
    replicas: dict[str, Any],
) -> None:
    """``POST /v1/jobs/{id}/priority`` through the replica that does not hold the job:
    it answered 409 ("only waiting jobs") on every replica but the one whose queue held
    the job, so behind a load balancer the console's re-prioritisation failed at random.
    Now the row is re-filed there and the holding replica follows it (lowering too)."""
    (a, b), (ca, cb), key = replicas["services"], replicas["clients"], replicas["key"]
    files = upload(make_study(replicas["root"] / "study"))
    a.scheduler.hold("test", "the job waits on replica A")
    try:
        first = _submit(ca, files, key, "inpatient")
        assert first.status_code == 202, first.text
        job_id = first.json()["id"]
        assert b.scheduler.job_info(job_id) is None

        for wanted in ("urgent", "outpatient"):
            moved = cb.post(
                f"/v1/jobs/{job_id}/priority",
                json={"priority_class": wanted},
                headers=auth(key),
            )
            assert moved.status_code == 200, moved.text
            assert moved.json()["priority_class"] == wanted.upper()

            cls = PriorityClass[wanted.upper()]
            until(lambda cls=cls: _filed_as(a, job_id, cls), f"replica A to file it {wanted}", 30)
        records = [r for r in a.store.iter_audit() if r.subject == job_id]
        moves = [
            (r.payload["old_priority_class"], r.payload["new_priority_class"])
            for r in records
            if r.action == "job.reprioritised"
        ]
        assert moves == [("INPATIENT", "URGENT"), ("URGENT", "OUTPATIENT")]
        assert all(r.actor_key_id == replicas["key_id"] for r in records[-2:])
    finally:
        a.scheduler.release()
    assert wait_job(ca, job_id, key, timeout=300 * WAIT_SCALE)["state"] == "succeeded"


def _filed_as(service: Service, job_id: str, cls: PriorityClass) -> bool:
    info = service.scheduler.job_info(job_id)
    return info is not None and info.cls is cls
