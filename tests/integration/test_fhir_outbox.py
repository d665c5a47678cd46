"""FHIR Bundles to a real HTTP server on loopback through the durable outbox: down then
up, 5xx/408/429 retried, other 4xx permanent with the reason, sent once, never resent,
and DICOM and FHIR rows kept apart. Time is passed in (``now``), never slept on."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.results import lesion_study

from radserve.fhir.delivery import FhirDestination, FhirOutbox
from radserve.gateway.outbox import RetryPolicy
from radserve.ingest import PatientInfo
from radserve.report.schema import Report
from radserve.store import Store, init_store
from radserve.store.outbox import NewDelivery, OutboxKind, OutboxState, OutboxStore

pytest.importorskip("fhir.resources")
from radserve.report.fhir import build_fhir_bundle

T0 = dt.datetime(2025, 3, 1, 8, 0, tzinfo=dt.UTC)
PATIENT = PatientInfo(
    patient_name="Doe^Jane", patient_id="PID-SECRET-42", patient_birth_date="19800101"
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return lesion_study(tmp_path_factory.mktemp("fhir-outbox")).report


def bundle(report: Report, job: str) -> dict[str, Any]:
    """A real, validated transaction Bundle; ``job`` makes its ids distinct."""
    return build_fhir_bundle(report.model_copy(update={"job_id": job}), PATIENT)


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[OutboxStore]:
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield OutboxStore(store.engine)
    store.close()


@pytest.fixture
def fhir() -> Iterator[FhirServer]:
    server = FhirServer()
    yield server
    server.down()


def outbox(rows: OutboxStore, fhir: FhirServer, **destination: Any) -> FhirOutbox:
    return FhirOutbox(
        rows,
        FhirDestination(url=fhir.url, **{"timeout_s": 5.0, **destination}),
        policy=RetryPolicy(first_delay_s=30, max_delay_s=600, give_up_after_s=3600),
    )


def test_server_down_then_up_every_bundle_arrives_once(
    rows: OutboxStore, fhir: FhirServer, report: Report, tmp_path: Path
) -> None:
    box = outbox(rows, fhir, bearer_token="tok-123")
    bundles = [bundle(report, "job-a"), bundle(report, "job-b")]
    for i, b in enumerate(bundles):
        box.enqueue(b, folder=tmp_path / f"job{i}", job_id=f"job-{i}", now=T0)

    # the server is down: connection refused is retried, nothing lost
    first = box.deliver_pending(T0)
    assert (first.claimed, first.sent, first.retried) == (2, 0, 2)
    pending = rows.items(kind=OutboxKind.FHIR)
    assert {r.state for r in pending} == {OutboxState.PENDING}
    assert all("cannot reach the FHIR server" in (r.last_error or "") for r in pending)
    assert box.deliver_pending(T0 + dt.timedelta(seconds=29)).claimed == 0  # backing off

    fhir.up()
    second = box.deliver_pending(T0 + dt.timedelta(seconds=31))
    assert (second.claimed, second.sent) == (2, 2)
    received = fhir.received
    assert [r.json() for r in received] == bundles  # byte-for-byte what was queued
    assert all(r.path == "/fhir" for r in received)
    assert {r.headers["Content-Type"] for r in received} == {"application/fhir+json"}
    assert {r.headers["Authorization"] for r in received} == {"Bearer tok-123"}

    # delivered rows are never sent again, and re-queueing a Bundle adds nothing
    box.enqueue(bundles[0], folder=tmp_path / "job0", job_id="job-0", now=T0)
    assert box.deliver_pending(T0 + dt.timedelta(days=2)).claimed == 0
    assert len(fhir.received) == 2
    sent = rows.items(kind=OutboxKind.FHIR)
    assert [r.state for r in sent] == [OutboxState.SENT] * 2 and all(r.sent_at for r in sent)


@pytest.mark.parametrize("status", [500, 502, 503, 408, 429])
def test_server_errors_and_throttling_are_retried(
    rows: OutboxStore, fhir: FhirServer, report: Report, tmp_path: Path, status: int
) -> None:
    fhir.up()
    fhir.script(Answer(status))
    box = outbox(rows, fhir)
    (item,) = [box.enqueue(bundle(report, "job-r"), folder=tmp_path, now=T0)]
    assert box.deliver_pending(T0).retried == 1
    row = rows.get(item.id)
    assert row.state is OutboxState.PENDING and row.last_error.startswith(f"HTTP {status}")
    assert row.next_attempt_at == T0 + dt.timedelta(seconds=30)
    assert box.deliver_pending(T0 + dt.timedelta(seconds=30)).sent == 1
    assert len(fhir.received) == 2 and rows.get(item.id).state is OutboxState.SENT


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 412, 422])
def test_other_client_errors_are_permanent_with_their_reason(
    rows: OutboxStore, fhir: FhirServer, report: Report, tmp_path: Path, status: int
) -> None:
    fhir.up()
    outcome = {
        "resourceType": "OperationOutcome",
        "issue": [
            {
                "severity": "error",
                "code": "invalid",
                "details": {"coding": [{"code": "MSG_PARAM_INVALID"}]},
                "diagnostics": "Patient Doe^Jane (PID-SECRET-42) is not valid",
            }
        ],
    }
    fhir.script(Answer(status, outcome))
    box = outbox(rows, fhir)
    item = box.enqueue(bundle(report, "job-p"), folder=tmp_path, now=T0)
    assert box.deliver_pending(T0).failed == 1
    row = rows.get(item.id)
    assert row.state is OutboxState.FAILED_PERMANENT
    assert row.last_error.startswith(f"HTTP {status}")
    assert "error invalid (MSG_PARAM_INVALID)" in row.last_error
    assert "PID-SECRET-42" not in row.last_error and "Doe" not in row.last_error
    assert box.deliver_pending(T0 + dt.timedelta(days=1)).claimed == 0  # needs a person
    assert rows.rearm(now=T0 + dt.timedelta(days=1), ids=[item.id]) == 1
    assert box.deliver_pending(T0 + dt.timedelta(days=1)).sent == 1


def test_a_slow_server_times_out_and_is_retried(
    rows: OutboxStore, fhir: FhirServer, report: Report, tmp_path: Path
) -> None:
    fhir.up()
    fhir.script(Answer(200, delay_s=1.5))
    box = outbox(rows, fhir, timeout_s=0.3)
    item = box.enqueue(bundle(report, "job-t"), folder=tmp_path, now=T0)
    assert box.deliver_pending(T0).retried == 1
    assert "no answer within 0.3 s" in (rows.get(item.id).last_error or "")


def test_retries_end_after_the_give_up_age(
    rows: OutboxStore, fhir: FhirServer, report: Report, tmp_path: Path
) -> None:
    box = outbox(rows, fhir)  # the server never comes up
    item = box.enqueue(bundle(report, "job-g"), folder=tmp_path, now=T0)
    now = T0
    for _ in range(20):  # bounded
        box.deliver_pending(now)
        if rows.get(item.id).state is OutboxState.FAILED_PERMANENT:
            break
        now = rows.get(item.id).next_attempt_at
    row = rows.get(item.id)
    assert row.state is OutboxState.FAILED_PERMANENT
    assert row.last_error.startswith(f"gave up after {row.attempts} attempts")


def test_dicom_and_fhir_rows_are_claimed_by_their_own_sender(
    rows: OutboxStore, fhir: FhirServer, report: Report, tmp_path: Path
) -> None:
    dicom = NewDelivery(
        destination="PACS",
        path=str(tmp_path / "x.dcm"),
        sop_class_uid="1.2.840.10008.5.1.4.1.1.66.4",
        sop_instance_uid="1.2.3.4",
        study_instance_uid="1.2.3",
        transfer_syntax_uid="1.2.840.10008.1.2.1",
    )
    rows.add([dicom], now=T0)
    fhir.up()
    box = outbox(rows, fhir)
    box.enqueue(bundle(report, "job-k"), folder=tmp_path, now=T0)
    assert box.deliver_pending(T0).sent == 1  # the DICOM row was not touched
    (left,) = rows.items(kind=OutboxKind.DICOM)
    assert left.state is OutboxState.PENDING and left.attempts == 0
    assert [r.kind for r in rows.claim_due(T0)] == [OutboxKind.DICOM]


def test_a_crash_while_sending_resends_once_after_the_lease(
    rows: OutboxStore, fhir: FhirServer, report: Report, tmp_path: Path
) -> None:
    fhir.up()
    box = outbox(rows, fhir)
    item = box.enqueue(bundle(report, "job-c"), folder=tmp_path, now=T0)
    # a worker claimed the row and died before recording the outcome
    (claimed,) = rows.claim_due(T0, kind=OutboxKind.FHIR)
    assert claimed.id == item.id
    assert box.deliver_pending(T0 + dt.timedelta(minutes=5)).claimed == 0  # leased
    assert box.deliver_pending(T0 + dt.timedelta(minutes=16)).sent == 1
    assert len(fhir.received) == 1 and rows.get(item.id).attempts == 2
