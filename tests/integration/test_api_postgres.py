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
from radserve.api.errors import status_for
from radserve.service import Service
from radserve.store.audited import open_audited
from radserve.store.errors import UnstorableValueError

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


def test_a_nul_character_is_a_400_never_a_database_error(tmp_path: Path, database_url: str) -> None:
    """PostgreSQL refuses NUL in a text: ``GET /v1/jobs/%00`` and ``?pipeline=%00`` were
    500s (psycopg's DataError). The edge refuses control characters in a path or query
    (400), and below it the store names a value it cannot hold as the caller's error."""
    service = Service(settings_for(tmp_path, database_url=database_url))
    admin = create_key(service.store, "admin")
    with (
        ServerThread(create_app(service, manage_service=False)) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        for path in ("/v1/jobs/a%00b", "/v1/jobs?pipeline=%00", "/dicomweb/studies/%00/series"):
            r = c.get(path, headers=auth(admin))
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", path
    with pytest.raises(UnstorableValueError, match="cannot be stored or searched"):
        service.store.get_job("a\x00b")
    assert status_for(UnstorableValueError("x")) == 400
    service.store.close()
