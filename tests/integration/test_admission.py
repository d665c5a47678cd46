"""Admission under concurrency (issue 12, item 9): real HTTP requests racing for the
last queue places. The limit holds exactly, and a refused request leaves no job row,
no audit record of a job and no stored files."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.service import (
    auth,
    live_server,
    make_study,
    settings_for,
    upload,
)

from radserve.service import Service
from radserve.store.files import STAGING_DIR, STUDIES_DIR

LIMIT = 7
CLIENTS = 21


@pytest.fixture()
def paused_server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A server whose workers are stopped, so nothing leaves the queue during a test."""
    settings = settings_for(tmp_path, scheduler__queue_limits__outpatient=LIMIT)
    with live_server(settings, roles=("submit",)) as live:
        live["service"].executor.stop(wait=True)
        yield {**live, "key": live["submit"]}


def _race(url: str, key: str, studies: list[list[Path]], **params: str) -> list[httpx.Response]:
    """Every study POSTed at once, one client thread each, released by one barrier."""
    bodies = [upload(files) for files in studies]
    barrier = threading.Barrier(len(bodies))

    def post(body: Any) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=120) as client:
            barrier.wait()
            return client.post("/v1/studies", files=body, params=params, headers=auth(key))

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def _stored_studies(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / STUDIES_DIR).glob("*/*") if p.is_dir()]


def test_concurrent_uploads_fill_the_queue_exactly_and_refusals_leave_nothing(
    paused_server: dict[str, Any], tmp_path: Path
) -> None:
    service: Service = paused_server["service"]
    studies = [make_study(tmp_path / f"study-{i}") for i in range(CLIENTS)]
    audit_before = Counter(r.action for r in service.store.iter_audit())

    answers = _race(paused_server["url"], paused_server["key"], studies)

    statuses = Counter(r.status_code for r in answers)
    assert statuses == {202: LIMIT, 503: CLIENTS - LIMIT}, [r.text for r in answers]
    for refused in (r for r in answers if r.status_code == 503):
        assert refused.json()["error"]["code"] == "queue_full"
        assert int(refused.headers["retry-after"]) > 0
    accepted = {r.json()["id"] for r in answers if r.status_code == 202}

    jobs = service.store.list_jobs(limit=100).items
    assert {j.id for j in jobs} == accepted  # no job row for a refused request
    assert Counter(str(j.state) for j in jobs) == {"queued": LIMIT}
    audit = Counter(r.action for r in service.store.iter_audit()) - audit_before
    assert audit == {"job.submitted": LIMIT}  # no job.failed, nothing for the refused
    data_dir = service.settings.data_dir
    stored = _stored_studies(data_dir)
    assert len(stored) == LIMIT  # a refused upload's files are not kept
    assert {str(p) for p in stored} == {j.study_path for j in jobs}
    assert not any((data_dir / STAGING_DIR).glob("*/*"))
    assert service.scheduler.snapshot().queued[service.scheduler.rules.default] == LIMIT


def test_urgent_work_is_admitted_past_a_full_routine_queue(
    paused_server: dict[str, Any], tmp_path: Path
) -> None:
    service: Service = paused_server["service"]
    routine = [make_study(tmp_path / f"routine-{i}") for i in range(LIMIT)]
    urgent = [make_study(tmp_path / f"urgent-{i}") for i in range(5)]
    first = _race(paused_server["url"], paused_server["key"], routine)
    assert [r.status_code for r in first] == [202] * LIMIT
    answers = _race(paused_server["url"], paused_server["key"], urgent, priority="urgent")
    assert [r.status_code for r in answers] == [202] * 5, [r.text for r in answers]
    assert all(r.json()["priority_class"] == "URGENT" for r in answers)
    assert len(_stored_studies(service.settings.data_dir)) == LIMIT + 5
