"""Every HTTP sender's attempt ends within its timeout in all, against a real receiver that
answers one byte every quarter second (tests/factories/drip_server.py).

httpx's timeout is per read: such a receiver held a critical push, a FHIR delivery or a
deadline-risk alert for as long as it kept dripping (the notice ``sending``, its lane
stalled), and the answer it finally completed counted as delivered. Now the attempt is
given up when its timeout is spent, while the receiver still has bytes to send: the
receiver sees the connection closed under it (``hung_up``) and the row is retried."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import pytest
from tests.factories.drip_server import drip_server

from radserve.critical.push import CriticalOutbox, Receiver
from radserve.fhir.delivery import FhirClient, FhirDestination
from radserve.gateway.scu import Outcome
from radserve.service.turnaround import _WebhookTarget
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

TIMEOUT_S = 1.0
HANG_UP_WAIT_S = 10.0  # a bound for a stuck test only, not a performance bound
PHASES: list[Literal["headers", "body"]] = ["headers", "body"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield opened
    opened.close()


@pytest.mark.parametrize("phase", PHASES)
def test_a_dripping_critical_webhook_is_retried_not_held(
    store: Store, tmp_path: Path, phase: Literal["headers", "body"]
) -> None:
    rows = OutboxStore(store.engine)
    with drip_server(phase) as receiver:
        box = CriticalOutbox(rows, [Receiver("ward", receiver.url, timeout_s=TIMEOUT_S)])
        try:
            box.enqueue({"id": "n-1", "study_instance_uid": "1.2.3"}, folder=tmp_path / "out")
            report = box.deliver_pending()
        finally:
            box.close()
        assert receiver.hung_up.wait(HANG_UP_WAIT_S)  # given up while it still dripped
        assert not receiver.finished.is_set()
    [row] = rows.items(kind=OutboxKind.CRITICAL)
    if phase == "body":  # the 2xx status came at once: acknowledged (radserve.http_answer)
        assert (report.claimed, report.retried, report.sent) == (1, 0, 1)
        assert row.state is OutboxState.SENT
        return
    assert (report.claimed, report.retried, report.sent) == (1, 1, 0)
    assert row.state is OutboxState.PENDING
    assert row.last_error == f"no answer within {TIMEOUT_S:g} s (the attempt's total)"


@pytest.mark.parametrize("phase", PHASES)
def test_a_dripping_fhir_server_is_retried_not_held(phase: Literal["headers", "body"]) -> None:
    client = FhirClient()
    with drip_server(phase) as server:
        try:
            result = client.post(FhirDestination(url=server.url, timeout_s=TIMEOUT_S), b"{}")
        finally:
            client.close()
        assert server.hung_up.wait(HANG_UP_WAIT_S)
        assert not server.finished.is_set()
    if phase == "body":  # the 2xx status came at once: acknowledged (radserve.http_answer)
        assert result.outcome is Outcome.SENT
        return
    assert result.outcome is Outcome.RETRY
    assert result.message.startswith(f"no answer within {TIMEOUT_S:g} s (fhir.timeout_s")


def test_a_dripping_risk_webhook_attempt_ends() -> None:
    """The deadline-risk alert reads only the status line: dripped, it is given up."""
    with drip_server("headers") as server:
        target = _WebhookTarget(server.url)
        try:
            with pytest.raises(httpx.TimeoutException):
                target.deliver({"event": "deadline_risk", "job_id": "j"})
        finally:
            target.close()
        assert server.hung_up.wait(HANG_UP_WAIT_S)
        assert not server.finished.is_set()
