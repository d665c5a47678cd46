"""A FHIR server that misbehaves in its answers, through the real outbox and a real HTTP
server on loopback (tests/factories/fhir_server.py).

Found on 2026-12-07: an error answer whose OperationOutcome is malformed -- ``issue``
null or no list, an issue's ``details`` no object, its ``coding`` null -- raised
TypeError or AttributeError in the classification: a 400 (a person must fix the Bundle)
was retried as "internal error: TypeError" with back-off for three days, the status
and the server's codes nowhere on the row. And an issue's ``code`` or ``severity`` that
is no FHIR code (free text, an object) was quoted whole into the row's reason and the
log, where the server's diagnostics, which may quote patient data, never go. And a 2xx
that is a web page (a sign-on or proxy page in front of a wrong or protected URL)
counted as delivered: the row went ``sent`` and no FHIR server had the Bundle.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.fhir_server import Answer, FhirServer

from radserve.fhir.delivery import FhirDestination, FhirOutbox
from radserve.gateway.outbox import RetryPolicy
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxState, OutboxStore

T0 = dt.datetime(2026, 12, 7, 8, 0, tzinfo=dt.UTC)
SECRET = "Doe^Jane PID-SECRET-42"


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[OutboxStore]:
    store: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield OutboxStore(store.engine)
    store.close()


@pytest.fixture
def fhir() -> Iterator[FhirServer]:
    with FhirServer() as server:
        yield server


def _outcome(issue: Any) -> dict[str, Any]:
    return {"resourceType": "OperationOutcome", "issue": issue}


MALFORMED = {
    "issue null": _outcome(None),
    "issue a number": _outcome(5),
    "issue an object": _outcome({"severity": "error", "code": "invalid"}),
    "details a list": _outcome([{"severity": "error", "code": "invalid", "details": [1]}]),
    "coding null": _outcome(
        [{"severity": "error", "code": "invalid", "details": {"coding": None}}]
    ),
    "coding items no objects": _outcome(
        [{"severity": "error", "code": "invalid", "details": {"coding": [None, 3, "x"]}}]
    ),
}


def _deliver(rows: OutboxStore, fhir: FhirServer, tmp_path: Path, answer: Answer) -> Any:
    outbox = FhirOutbox(
        rows,
        FhirDestination(url=fhir.url, timeout_s=5.0),
        policy=RetryPolicy(first_delay_s=30, max_delay_s=600, give_up_after_s=3600),
    )
    bundle = {"resourceType": "Bundle", "id": "b-1", "type": "transaction", "entry": []}
    outbox.enqueue(bundle, folder=tmp_path, job_id="job-1", now=T0)
    fhir.script(answer)
    outbox.deliver_pending(T0)
    [row] = rows.items()
    return row


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_4xx_with_a_malformed_operation_outcome_fails_for_good_by_its_status(
    rows: OutboxStore, fhir: FhirServer, tmp_path: Path, body: dict[str, Any]
) -> None:
    row = _deliver(rows, fhir, tmp_path, Answer(status=400, body=body))
    # a person must fix the Bundle: not retried for three days as an internal error
    assert row.state is OutboxState.FAILED_PERMANENT, row
    assert row.last_error.startswith("HTTP 400"), row.last_error
    assert "internal error" not in row.last_error


UNREADABLE = {name: MALFORMED[name] for name in ("issue null", "issue a number", "issue an object")}


@pytest.mark.parametrize("body", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_5xx_with_a_malformed_operation_outcome_is_retried_by_its_status(
    rows: OutboxStore, fhir: FhirServer, tmp_path: Path, body: dict[str, Any]
) -> None:
    row = _deliver(rows, fhir, tmp_path, Answer(status=503, body=body))
    assert row.state is OutboxState.PENDING, row
    assert row.last_error.startswith("HTTP 503"), row.last_error
    assert "internal error" not in row.last_error


@pytest.mark.parametrize(
    "issue",
    [
        {"severity": "error", "code": f"patient {SECRET} unknown"},
        {"severity": f"error for {SECRET}", "code": "invalid"},
        {"severity": "error", "code": {"text": SECRET}},
        {
            "severity": "error",
            "code": "invalid",
            "details": {"coding": [{"code": f"{SECRET} is no patient here"}]},
        },
    ],
    ids=["code text", "severity text", "code an object", "details code text"],
)
def test_an_operation_outcome_s_free_text_is_not_quoted_in_the_reason(
    rows: OutboxStore, fhir: FhirServer, tmp_path: Path, issue: dict[str, Any]
) -> None:
    row = _deliver(rows, fhir, tmp_path, Answer(status=422, body=_outcome([issue])))
    assert row.state is OutboxState.FAILED_PERMANENT, row
    assert row.last_error.startswith("HTTP 422"), row.last_error
    for word in ("Doe", "Jane", "SECRET"):
        assert word not in row.last_error, row.last_error


LOGIN_PAGE = b"<!DOCTYPE html><html><body><form action='/sso'>Sign in</form></body></html>"


@pytest.mark.parametrize(
    "content_type", ["text/html; charset=utf-8", "TEXT/HTML", "application/xhtml+xml"]
)
def test_a_2xx_web_page_is_no_delivery(
    rows: OutboxStore, fhir: FhirServer, tmp_path: Path, content_type: str
) -> None:
    """A single sign-on or proxy page answering 200 in front of a wrong or protected URL:
    before, the Bundle counted as delivered (``sent``) and no FHIR server had it."""
    row = _deliver(rows, fhir, tmp_path, Answer(raw=LOGIN_PAGE, content_type=content_type))
    assert row.state is OutboxState.FAILED_PERMANENT, row
    assert row.sent_at is None
    assert row.last_error.startswith("HTTP 200 with a web page"), row.last_error
    assert "fhir.url" in row.last_error


def test_a_2xx_fhir_answer_is_still_a_delivery(
    rows: OutboxStore, fhir: FhirServer, tmp_path: Path
) -> None:
    row = _deliver(rows, fhir, tmp_path, Answer(status=200))
    assert row.state is OutboxState.SENT and row.last_error is None, row


@pytest.mark.parametrize(
    ("status", "retry_after", "wait_s"),
    [
        (503, "600", 600.0),  # longer than the first back-off (30 s): as asked
        (429, "5", 30.0),  # shorter: the back-off stands
        (503, "86400", 600.0),  # a day: no longer than the policy's longest wait
        (429, "soon", 30.0),  # unreadable: the back-off
    ],
    ids=["asks 600 s", "asks 5 s", "asks a day", "unreadable"],
)
def test_a_retry_waits_as_long_as_the_server_asks(
    rows: OutboxStore,
    fhir: FhirServer,
    tmp_path: Path,
    status: int,
    retry_after: str,
    wait_s: float,
) -> None:
    """A 429 or 503 with ``Retry-After`` is tried again no sooner than it asks (within
    the policy's longest wait), and the reason says so. Before, it was retried on
    radserve's own back-off, 30 s first, however long the server asked for."""
    answer = Answer(status=status, headers=(("Retry-After", retry_after),))
    row = _deliver(rows, fhir, tmp_path, answer)
    assert row.state is OutboxState.PENDING, row
    waited = (row.next_attempt_at - T0).total_seconds()
    assert wait_s <= waited < wait_s + 30.0, (waited, row.last_error)
    if retry_after.isdigit():
        assert f"asks to wait {retry_after} s (Retry-After)" in row.last_error
