"""The same study submitted again while its first job is still unfinished is answered by
that job, through a real server (on SQLite and on PostgreSQL).

Before, every submission whose input had no succeeded result yet made a job of its own:
the same study sent twice at once (a client retrying, two modalities' routes, two
replicas behind a load balancer) ran twice and made two results. Now a submitter who may
see the unfinished job gets it back (202, its id; a ``job.joined`` audit record), a more
urgent one raises it (``job.reprioritised``, reason ``duplicate_submission``), and a
submitter of another site (``security.visibility: site``) still gets a job of its own, so
the answer does not tell it that another site has that study."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.factories.service import (
    ServerThread,
    auth,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.domain.priority import PriorityClass
from radserve.service import Service

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_postgres)])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        database = {}
        if request.param == "postgres":
            database["database_url"] = stack.enter_context(postgres_schema("radserve_dup"))
        service = Service(settings_for(tmp_path, security__visibility="site", **database))
        keys = {
            name: service.store.create_api_key(name=name, role="submit", site=site)[1]
            for name, site in (("a1", "A"), ("a2", "A"), ("b", "B"))
        }
        srv = stack.enter_context(ServerThread(create_app(service)))
        client = stack.enter_context(httpx.Client(base_url=srv.url, timeout=120))
        assert service.wait_warm(60 * WAIT_SCALE)
        yield {"service": service, "client": client, "keys": keys, "root": tmp_path}


def _submit(c: httpx.Client, files: list[Any], token: str, priority: str) -> httpx.Response:
    return c.post(f"/v1/studies?priority={priority}", files=files, headers=auth(token))


def test_a_study_sent_again_while_its_job_waits_is_answered_by_that_job(
    server: dict[str, Any],
) -> None:
    service, c, keys = server["service"], server["client"], server["keys"]
    files = upload(make_study(server["root"] / "study"))
    service.scheduler.hold("test", "the first job stays waiting")
    try:
        first = _submit(c, files, keys["a1"], "outpatient")
        assert first.status_code == 202, first.text
        job_id = first.json()["id"]

        # the same study twice more at once, by the same key and another key of site A
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda token=token: answers.append(_submit(c, files, token, "outpatient"))
            )
            for token in (keys["a1"], keys["a2"])
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120 * WAIT_SCALE)
        assert [(r.status_code, r.json()["id"]) for r in answers] == [(202, job_id)] * 2
        assert all(r.json()["cached"] is False for r in answers)

        # site B may not see A's job: it gets its own, and nothing of A's
        other = _submit(c, files, keys["b"], "outpatient")
        assert other.status_code == 202, other.text
        other_id = other.json()["id"]
        assert other_id != job_id and job_id not in other.text

        # a more urgent second submission raises the waiting job, audited
        urgent = _submit(c, files, keys["a2"], "urgent")
        assert (urgent.status_code, urgent.json()["id"]) == (202, job_id)
        assert urgent.json()["priority_class"] == "URGENT"
        info = service.scheduler.job_info(job_id)
        assert info is not None and info.cls is PriorityClass.URGENT
        row = service.store.get_job(job_id)
        assert row.priority_class is PriorityClass.URGENT
        tat = service.scheduler.config.tat(PriorityClass.URGENT)
        assert abs((row.deadline - row.arrival).total_seconds() - tat) < 1e-3

        a2_id = keys["a2"].split("_")[1]
        records = [r for r in service.store.iter_audit() if r.subject == job_id]
        joined = [r for r in records if r.action == "job.joined"]
        assert len(joined) == 3
        assert {r.payload["priority_class_asked"] for r in joined} == {"OUTPATIENT", "URGENT"}
        [raised] = [r for r in records if r.action == "job.reprioritised"]
        assert raised.actor_key_id == a2_id
        assert raised.payload["reason"] == "duplicate_submission"
        assert (raised.payload["old_priority_class"], raised.payload["new_priority_class"]) == (
            "OUTPATIENT",
            "URGENT",
        )
        jobs = service.store.list_jobs(limit=20).items
        assert sorted(j.id for j in jobs) == sorted([job_id, other_id])
    finally:
        service.scheduler.release()

    assert wait_job(c, job_id, keys["a2"], timeout=300 * WAIT_SCALE)["state"] == "succeeded"
    assert wait_job(c, other_id, keys["b"], timeout=300 * WAIT_SCALE)["state"] == "succeeded"
    # once it succeeded, the same study is answered from its result as before
    cached = _submit(c, files, keys["a2"], "outpatient")
    assert cached.status_code == 200 and cached.json()["cached_from"] == job_id
