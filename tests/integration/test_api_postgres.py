"""The API over PostgreSQL (the cluster store): submissions, results, the cache and
the audit chain. Runs when ``RADSERVE_TEST_DATABASE_URL`` is set, in a schema of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.service import Service
from radserve.store.audited import open_audited

pytestmark = requires_postgres


@pytest.fixture
def database_url() -> Iterator[str]:
    with postgres_schema("radserve_api") as url:
        yield url


def test_jobs_results_and_audit_on_postgres(tmp_path: Path, database_url: str) -> None:
    service = Service(settings_for(tmp_path, database_url=database_url))
    assert service.store.dialect == "postgresql"
    key = create_key(service.store, "submit")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        study = make_study(tmp_path / "a")
        first = c.post("/v1/studies", files=upload(study), headers=auth(key)).json()
        other = c.post("/v1/studies", files=upload(make_study(tmp_path / "b")), headers=auth(key))
        assert wait_job(c, first["id"], key)["state"] == "succeeded"
        assert wait_job(c, other.json()["id"], key)["state"] == "succeeded"
        cached = c.post("/v1/studies", files=upload(study), headers=auth(key))
        assert cached.status_code == 200 and cached.json()["cached_from"] == first["id"]
        page = c.get("/v1/jobs", params={"limit": 2}, headers=auth(key)).json()
        assert len(page["items"]) == 2 and page["next_cursor"]
    store, _ = open_audited(service.settings)
    try:
        assert store.verify_audit().ok
        actions = [r.action for r in store.iter_audit()]
        assert actions.count("job.succeeded") == 2 and actions.count("job.cached") == 1
    finally:
        store.close()
