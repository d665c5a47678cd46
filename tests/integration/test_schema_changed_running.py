"""A running replica whose PostgreSQL database a newer radserve migrates beneath it (a
rolling upgrade that did not stop the older replicas first): at its next lease renewal it
is not ready (``/readyz`` names both revisions), refuses new studies (503
``schema_not_current`` with Retry-After), hands out no new work (its jobs say
``waiting_for: schema_not_current`` and have no ETA), renews no lease (so a replica of
the newer radserve takes its jobs over) and asks to be stopped (``radserve serve`` then
exits 2). Before, it went on as if nothing had happened: ready, taking studies, running
them on a schema it does not know.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from tests.factories.dicom_net import free_port
from tests.factories.postgres import postgres_schema
from tests.factories.server_process import start_server, stop_servers
from tests.factories.service import (
    ServerThread,
    auth,
    config_file,
    create_key,
    make_study,
    settings_for,
    upload,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.service import Service
from radserve.store.db import make_engine
from radserve.store.migrate import head_revision

NEWER = "9999_from_a_newer_radserve"
WAIT_S = 60.0


@pytest.fixture
def database_url() -> Iterator[str]:
    with postgres_schema("radserve_schema_moves") as url:
        yield url


def _stamp(url: str, revision: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": revision})
    finally:
        engine.dispose()


def _lease_renewed(url: str, job_id: str) -> Any:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                text("SELECT lease_renewed FROM jobs WHERE id = :id"), {"id": job_id}
            ).scalar_one()
    finally:
        engine.dispose()


def test_a_replica_stops_taking_work_when_a_newer_radserve_migrates_its_database(
    tmp_path: Path, database_url: str
) -> None:
    settings = settings_for(
        tmp_path,
        database_url=database_url,
        jobs__lease_s=3.0,  # renewed (and the schema read) every second
        outbox__replicas=2,
        outbox__instance_id="replica-old",
    )
    service = Service(settings)
    stops: list[str] = []
    service.stop_requested = stops.append
    key = create_key(service.store, "submit")
    try:
        with (
            ServerThread(create_app(service, key_ttl_s=3600)) as srv,
            httpx.Client(base_url=srv.url, headers=auth(key), timeout=60) as c,
        ):
            assert service.wait_warm(120 * WAIT_SCALE)
            until(lambda: c.get("/readyz").status_code == 200, "ready", 120)
            service.scheduler.hold("test", "the study waits")  # it stays unfinished
            submitted = c.post("/v1/studies", files=upload(make_study(tmp_path / "a")))
            assert submitted.status_code == 202, submitted.text
            job_id = submitted.json()["id"]

            _stamp(database_url, NEWER)  # the newer radserve's migration
            try:

                def not_ready() -> dict[str, Any] | None:
                    answer = c.get("/readyz")
                    body: dict[str, Any] = answer.json()
                    changed = [r for r in body["reasons"] if "schema changed" in r]
                    return body if answer.status_code == 503 and changed else None

                body = until(not_ready, "/readyz to name the changed schema", WAIT_S, step=0.2)
                reason = next(r for r in body["reasons"] if "schema changed" in r)
                assert NEWER in reason and head_revision() in reason, reason
                assert body["work_held"] == "schema_not_current", body
                assert len(stops) == 1 and NEWER in stops[0], stops

                job = c.get(f"/v1/jobs/{job_id}").json()
                assert job["state"] in ("queued", "running"), job
                assert job["eta"] is None, job
                assert job["waiting_for"]["reason"] == "schema_not_current", job
                assert NEWER in job["waiting_for"]["message"], job

                refused = c.post("/v1/studies", files=upload(make_study(tmp_path / "b")))
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "schema_not_current", refused.text
                assert refused.headers.get("retry-after"), refused.headers

                # no lease renewed any more: the newer radserve's replicas take the job
                renewed = _lease_renewed(database_url, job_id)
                service.leases.renew()  # what the keeper's next rounds do
                service.leases.renew()
                assert _lease_renewed(database_url, job_id) == renewed
                assert len(stops) == 1  # asked once
            finally:
                _stamp(database_url, head_revision())
    finally:
        service.stop()


def test_serve_stops_with_one_line_and_exit_2_when_its_schema_changes(
    tmp_path: Path, database_url: str
) -> None:
    config = config_file(tmp_path, database_url=database_url, jobs={"lease_s": 3.0})
    data, log = tmp_path / "data", tmp_path / "serve.log"
    server: subprocess.Popen[bytes] | None = start_server(config, data, free_port(), log)
    try:
        _stamp(database_url, NEWER)
        assert server is not None
        try:
            returncode = server.wait(60 * WAIT_SCALE)
        except subprocess.TimeoutExpired:
            returncode = None
        output = log.read_text(errors="replace")
        assert returncode == 2, output[-3000:]
        assert "error [schema_not_current]" in output, output[-3000:]
        assert NEWER in output and "Traceback" not in output, output[-3000:]
        server = None
    finally:
        stop_servers([server])
        _stamp(database_url, head_revision())
