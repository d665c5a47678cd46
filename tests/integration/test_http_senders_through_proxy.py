"""The HTTP senders go through the proxy the server's environment names, and each
attempt's total deadline holds through it: a receiver behind the proxy that answers one
byte every quarter second is given up when the attempt's time is spent.

Found on 2026-12-06: the senders' client (radserve.http_deadline) brought its own
transport, and httpx reads ``HTTP(S)_PROXY`` only for a client with its default one: a
site whose outbound traffic must go through its proxy had every critical notice, FHIR
Bundle and risk alert sent around it (refused, or silently unproxied). Now the
environment's proxies are mounted on the deadline transport. A real forward proxy on
loopback (tests/factories/forward_proxy.py): plain HTTP forwarded, HTTPS tunnelled with
CONNECT to a TLS receiver signed by a test CA (``SSL_CERT_FILE``)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.factories.drip_server import DripServer, drip_server
from tests.factories.forward_proxy import ForwardProxy, forward_proxy
from tests.factories.tls import HAVE_OPENSSL, make_pki

from radserve.critical.push import CriticalOutbox, Receiver
from radserve.fhir.delivery import FhirClient, FhirDestination
from radserve.gateway.scu import Outcome
from radserve.service.turnaround import _WebhookTarget
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

TIMEOUT_S = 1.0
HANG_UP_WAIT_S = 10.0  # a bound for a stuck test only, not a performance bound
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")

pytestmark = pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed")


@pytest.fixture(params=["http", "https"])
def receiver(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[DripServer, ForwardProxy]]:
    """A dripping receiver (plain or TLS) and the proxy the environment names for it."""
    tls = None
    if request.param == "https":
        pki = make_pki(tmp_path / "pki")
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(pki.server_cert, pki.server_key)
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))  # the client trusts the test CA
    for name in PROXY_VARIABLES:  # a CI's own NO_PROXY=127.0.0.1 would bypass it
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    with drip_server("headers", tls=tls) as server, forward_proxy() as proxy:
        monkeypatch.setenv(f"{request.param.upper()}_PROXY", proxy.url)
        yield server, proxy


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened: Store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield opened
    opened.close()


def _through(proxy: ForwardProxy, server: DripServer) -> bool:
    """Whether the proxy was asked for ``server`` (a tunnel to it, or its URL)."""
    address = server.url.split("://", 1)[1].split("/", 1)[0]
    return f"CONNECT {address}" in proxy.seen() or f"POST {server.url}" in proxy.seen()


def test_a_critical_webhook_behind_the_proxy_is_given_up_in_time(
    receiver: tuple[DripServer, ForwardProxy], store: Store, tmp_path: Path
) -> None:
    server, proxy = receiver
    rows = OutboxStore(store.engine)
    box = CriticalOutbox(rows, [Receiver("ward", server.url, timeout_s=TIMEOUT_S)])
    try:
        box.enqueue({"id": "n-1", "study_instance_uid": "1.2.3"}, folder=tmp_path / "out")
        report = box.deliver_pending()
    finally:
        box.close()
    assert _through(proxy, server), proxy.seen()
    assert server.hung_up.wait(HANG_UP_WAIT_S)  # given up while it still dripped
    assert not server.finished.is_set()
    assert (report.claimed, report.retried, report.sent) == (1, 1, 0)
    [row] = rows.items(kind=OutboxKind.CRITICAL)
    assert row.state is OutboxState.PENDING
    assert row.last_error == f"no answer within {TIMEOUT_S:g} s (the attempt's total)"


def test_a_fhir_server_behind_the_proxy_is_given_up_in_time(
    receiver: tuple[DripServer, ForwardProxy],
) -> None:
    server, proxy = receiver
    client = FhirClient()
    try:
        result = client.post(FhirDestination(url=server.url, timeout_s=TIMEOUT_S), b"{}")
    finally:
        client.close()
    assert _through(proxy, server), proxy.seen()
    assert server.hung_up.wait(HANG_UP_WAIT_S)
    assert not server.finished.is_set()
    assert result.outcome is Outcome.RETRY
    assert result.message.startswith(f"no answer within {TIMEOUT_S:g} s (fhir.timeout_s")


def test_a_risk_webhook_behind_the_proxy_attempt_ends(
    receiver: tuple[DripServer, ForwardProxy],
) -> None:
    server, proxy = receiver
    target = _WebhookTarget(server.url)
    try:
        with pytest.raises(httpx.TimeoutException):
            target.deliver({"event": "deadline_risk", "job_id": "j"})
    finally:
        target.close()
    assert _through(proxy, server), proxy.seen()
    assert server.hung_up.wait(HANG_UP_WAIT_S)
    assert not server.finished.is_set()


def test_no_proxy_sends_direct(
    receiver: tuple[DripServer, ForwardProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NO_PROXY`` names the hosts reached directly (an in-hospital receiver)."""
    server, proxy = receiver
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    client = FhirClient()
    try:
        result = client.post(FhirDestination(url=server.url, timeout_s=TIMEOUT_S), b"{}")
    finally:
        client.close()
    assert proxy.seen() == []
    assert server.requests == 1
    assert result.outcome is Outcome.RETRY
