"""The server POSTs each job's FHIR Bundle to the configured FHIR server (a real HTTP
server on loopback), which is down when the job finishes and comes back later: the
Bundle arrives once, and it is the Bundle ``GET /v1/jobs/{id}/fhir`` serves."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from tests.factories.fhir_server import FhirServer
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.service import Service
from radserve.store.outbox import OutboxItem, OutboxKind, OutboxState, OutboxStore

pytest.importorskip("fhir.resources")


def _rows(service: Service) -> list[OutboxState]:
    return [r.state for r in OutboxStore(service.store.engine).items(kind=OutboxKind.FHIR)]


def test_bundle_reaches_the_fhir_server_once_after_it_comes_back(tmp_path: Path) -> None:
    fhir = FhirServer()  # down: nothing listens on its port yet
    settings = settings_for(
        tmp_path,
        fhir__url=fhir.url,
        fhir__bearer_token="tok-xyz",
        fhir__timeout_s=5,
        fhir__retry_first_s=0.2,
        fhir__retry_max_s=0.5,
    )
    service = Service(settings)
    try:
        with (
            ServerThread(create_app(service)) as srv,
            httpx.Client(base_url=srv.url, timeout=60) as c,
        ):
            assert service.wait_warm(60 * WAIT_SCALE)
            key = create_key(service.store, "submit")
            files = make_study(tmp_path / "study", extra={"PatientID": "PID-FHIR-1"})
            submitted = c.post("/v1/studies", files=upload(files), headers=auth(key)).json()
            job = wait_job(c, submitted["id"], key)
            assert job["state"] == "succeeded", job

            # the held Bundle falls due when the result is recorded, and the sender is woken
            # then: two attempts well inside its 30 s idle interval
            def fhir_rows() -> list[OutboxItem]:
                return OutboxStore(service.store.engine).items(kind=OutboxKind.FHIR)

            # the worker keeps retrying while it is down
            until(lambda: (rows := fhir_rows()) and rows[0].attempts >= 2, "two attempts", 15)
            (row,) = fhir_rows()
            assert row.state in (OutboxState.PENDING, OutboxState.SENDING), row
            assert row.attempts >= 2 and row.job_id == job["id"]

            fhir.up()
            until(
                lambda: _rows(service) == [OutboxState.SENT],
                "the Bundle sent",
                30,
                state=lambda: _rows(service),
            )
            served = c.get(f"/v1/jobs/{job['id']}/fhir", headers=auth(key)).json()
            time.sleep(1.0)  # a second delivery, were there one, would have happened by now
            (received,) = fhir.received
            assert received.json() == served
            assert received.headers["Authorization"] == "Bearer tok-xyz"
            patient = next(
                e["resource"] for e in served["entry"] if e["resource"]["resourceType"] == "Patient"
            )
            assert patient["identifier"][0]["value"] == "PID-FHIR-1"
    finally:
        fhir.down()
