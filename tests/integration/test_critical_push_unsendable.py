"""A critical notice whose send raises is settled, never left ``sending``.

Probe of 2026-12-06: a receiver at ``http://[::1/hook`` loaded, and each attempt raised
httpx's InvalidURL out of the outbox's batch: a traceback, the row ``sending`` with no
error, the batch's later notices not sent, and ``/v1/ops/outbox``, the metrics and
``/readyz`` all fine. The settings now refuse such a URL at load; the sender, whatever
raises while one row is sent, settles that row: failed_permanent where the same request
can never succeed (a URL the client refuses), else retried with the reason recorded.
Real loopback receivers, a real SQLite outbox, the real operator view."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.factories.fhir_server import Answer, FhirServer

from radserve.config import load_settings
from radserve.critical.push import CriticalOutbox, Receiver
from radserve.critical.receivers import FhirReceiver
from radserve.fhir.delivery import FhirClient, FhirDestination
from radserve.gateway.outbox import utc_now
from radserve.gateway.scu import Outcome, SendResult
from radserve.service.critical import receivers
from radserve.service.outbox import OutboxOps
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxItem, OutboxKind, OutboxState, OutboxStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield opened
    opened.close()


def _notice(n: int) -> dict[str, object]:
    return {"id": f"notice-{n}", "study_instance_uid": "1.2.3", "job_id": "job-1"}


def _by_destination(rows: OutboxStore) -> dict[str, list[OutboxItem]]:
    out: dict[str, list[OutboxItem]] = {}
    for row in rows.items(kind=OutboxKind.CRITICAL):
        out.setdefault(row.destination, []).append(row)
    return out


def test_a_url_the_client_refuses_fails_the_row_for_good_and_shows_in_health(
    store: Store, tmp_path: Path
) -> None:
    rows = OutboxStore(store.engine)
    settled: list[tuple[str, Outcome]] = []
    with FhirServer() as ok:
        box = CriticalOutbox(
            rows,
            [
                Receiver("badv6", "http://[::1/hook"),  # the probe's
                Receiver("badport", "http://127.0.0.1:port/hook"),
                Receiver("ftp", "ftp://127.0.0.1/hook"),
                Receiver("ok", ok.url),
            ],
            on_settled=lambda item, outcome, _r, _at: settled.append((item.destination, outcome)),
        )
        try:
            for n in range(3):
                box.enqueue(_notice(n), folder=tmp_path / "out", job_id="job-1")
            report = box.deliver_pending()  # raised InvalidURL before
        finally:
            box.close()
        assert len(ok.received) == 3  # the batch went on past the bad receivers
    assert (report.claimed, report.sent, report.failed) == (12, 3, 9)
    by = _by_destination(rows)
    assert all(r.state is OutboxState.SENT for r in by["critical:ok"])
    for bad in ("critical:badv6", "critical:badport", "critical:ftp"):
        assert {r.state for r in by[bad]} == {OutboxState.FAILED_PERMANENT}, bad
        for row in by[bad]:
            assert row.last_error is not None and "refuses the URL" in row.last_error
            assert "[::1" not in row.last_error and ":port" not in row.last_error
    # told to the metrics' listener, and seen by the operator's view and /readyz
    assert sorted(settled).count(("critical:badv6", Outcome.PERMANENT)) == 3
    settings = load_settings(None, data_dir=tmp_path)
    ops = OutboxOps(settings, store)
    status = {s.destination: s for s in ops.status()}
    assert status["critical:badv6"].failed_permanent == 3
    assert status["critical:badv6"].sending == 0
    assert "refuses the URL" in (status["critical:badv6"].last_error or "")
    unreachable = ops.unreachable()
    assert {"critical:badv6", "critical:badport", "critical:ftp"} <= set(unreachable)
    assert "critical:ok" not in unreachable


def test_any_exception_while_sending_one_row_settles_it_as_a_retry(
    store: Store, tmp_path: Path
) -> None:
    """A token the HTTP client cannot encode (non-ASCII: UnicodeEncodeError, no transport
    error) escaped the batch before; now the row is retried with the reason recorded."""
    rows = OutboxStore(store.engine)
    with FhirServer() as ok:
        box = CriticalOutbox(
            rows,
            [Receiver("odd", ok.url, bearer_token="t\u00f6k\u00e9n"), Receiver("ok", ok.url)],
        )
        try:
            box.enqueue(_notice(1), folder=tmp_path / "out", job_id="job-1")
            report = box.deliver_pending()
        finally:
            box.close()
        assert len(ok.received) == 1
    assert (report.claimed, report.sent, report.retried) == (2, 1, 1)
    (odd,) = _by_destination(rows)["critical:odd"]
    assert odd.state is OutboxState.PENDING and odd.attempts == 1
    assert odd.last_error == "internal error: UnicodeEncodeError"
    assert "t\u00f6k" not in (odd.last_error or "")
    (status,) = [
        s for s in OutboxOps(load_settings(None, data_dir=tmp_path), store).status()
        if s.destination == "critical:odd"
    ]  # fmt: skip
    assert (status.retrying, status.sending) == (1, 0)


def test_a_fhir_server_url_the_client_refuses_is_permanent(tmp_path: Path) -> None:
    client = FhirClient()
    try:
        result = client.post(FhirDestination("http://[::1/fhir"), b"{}")
    finally:
        client.close()
    assert result.outcome is Outcome.PERMANENT
    assert "fhir.url" in result.message


def test_a_critical_fhir_receivers_timeout_names_its_own_setting(tmp_path: Path) -> None:
    """The receiver's own ``timeout_s`` ran out, not ``fhir.timeout_s`` (the old text)."""
    config = tmp_path / "radserve.yaml"
    with FhirServer() as ehr:
        config.write_text(
            f"data_dir: {tmp_path / 'data'}\n"
            "critical:\n  receivers:\n"
            f"    - {{name: ehr, kind: fhir, url: '{ehr.url}', timeout_s: 0.2}}\n"
        )
        (receiver,) = receivers(load_settings(config))
        assert isinstance(receiver, FhirReceiver)
        ehr.script(Answer(200, delay_s=1.0))
        bundle = b'{"resourceType": "Bundle", "type": "transaction", "entry": []}'
        try:
            result: SendResult = receiver.send(bundle)
        finally:
            receiver.close()
    assert result.outcome is Outcome.RETRY
    assert "0.2 s" in result.message
    assert "fhir.timeout_s" not in result.message
    assert "critical.receivers.0.timeout_s" in result.message


def test_unsendable_rows_do_not_stay_sending_across_rounds(store: Store, tmp_path: Path) -> None:
    """A later round (a month on: never given up by age) claims nothing left ``sending``."""
    rows = OutboxStore(store.engine)
    box = CriticalOutbox(rows, [Receiver("badv6", "http://[::1/hook")])
    try:
        box.enqueue(_notice(1), folder=tmp_path / "out")
        box.deliver_pending()
        later = box.deliver_pending(utc_now() + dt.timedelta(days=30))
    finally:
        box.close()
    assert later.claimed == 0
    assert [r.state for r in rows.items(kind=OutboxKind.CRITICAL)] == [OutboxState.FAILED_PERMANENT]
    httpx.URL("http://127.0.0.1/")  # the client itself is fine
