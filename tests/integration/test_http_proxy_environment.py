"""The HTTP senders read the proxy variables as curl does, through public API only, with
a real forward proxy on loopback (tests/factories/forward_proxy.py) in front of real
receivers (plain HTTP, and HTTPS tunnelled with CONNECT).

Found on 2026-12-07: radserve.http_deadline read the variables through httpx's private
``httpx._utils.get_environment_proxies`` (gone or renamed by any httpx release that
wants to), which also took a CIDR ``NO_PROXY`` entry (``127.0.0.0/8``) for a host name
that matches nothing: a site listing its hospital network that way had every
in-hospital receiver reached through its outbound proxy. An ``ALL_PROXY`` naming a
SOCKS proxy (httpcore needs ``socksio`` for one, which radserve does not install) raised
at the first send, a traceback (``RuntimeError`` from the FHIR client). Now a SOCKS
proxy a receiver would go through stops ``radserve serve`` at start, in one line."""

from __future__ import annotations

import http.server
import json
import os
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.factories.fhir_server import FhirServer
from tests.factories.forward_proxy import ForwardProxy, forward_proxy
from tests.factories.server_process import run_radserve
from tests.factories.service import config_file
from tests.factories.tls import HAVE_OPENSSL, make_pki

from radserve.fhir.delivery import FhirClient, FhirDestination
from radserve.gateway.scu import Outcome, SendResult

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the variables set (a CI's own NO_PROXY=127.0.0.1 would bypass the proxy)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    with forward_proxy() as running:
        yield running


@pytest.fixture
def receiver() -> Iterator[FhirServer]:
    with FhirServer() as running:
        yield running


@dataclass
class HttpsReceiver:
    url: str = ""
    posted: list[str] = field(default_factory=list)  # the path of each POST


@contextmanager
def https_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpsReceiver]:
    """An HTTPS receiver (certificate of a test CA the client trusts through
    ``SSL_CERT_FILE``) answering every POST 200."""
    pki = make_pki(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    receiver = HttpsReceiver()
    posted = receiver.posted

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            posted.append(self.path)
            body = json.dumps({"resourceType": "Bundle", "type": "transaction-response"})
            self.send_response(200)
            self.send_header("Content-Type", "application/fhir+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"https://127.0.0.1:{server.server_address[1]}/fhir"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _post(url: str) -> SendResult:
    client = FhirClient()
    try:
        return client.post(FhirDestination(url=url, timeout_s=10.0), b"{}")
    finally:
        client.close()


def _address(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


@pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed")
@pytest.mark.parametrize("variable", ["https_proxy", "ALL_PROXY", "all_proxy"])
def test_https_goes_through_the_proxy_a_variable_of_either_case_names(
    variable: str, proxy: ForwardProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with https_receiver(tmp_path, monkeypatch) as https:
        monkeypatch.setenv(variable, proxy.url)
        result = _post(https.url)
        assert result.outcome is Outcome.SENT, result.message
        assert https.posted == ["/fhir"]
    assert proxy.seen() == [f"CONNECT {_address(https.url)}"]  # tunnelled, TLS end to end


def test_lowercase_wins_over_uppercase(
    proxy: ForwardProxy, receiver: FhirServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """curl's and the standard library's rule: ``http_proxy`` before ``HTTP_PROXY``."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("http_proxy", proxy.url)
    result = _post(receiver.url)
    assert result.outcome is Outcome.SENT, result.message
    assert proxy.seen() == [f"POST {receiver.url}"]
    assert len(receiver.received) == 1


@pytest.mark.parametrize(
    ("no_proxy", "host"),
    [
        ("127.0.0.0/8", "127.0.0.1"),  # a CIDR network (httpx's reading: proxied)
        ("10.0.0.0/8, 127.0.0.1/32", "127.0.0.1"),
        ("::1/128,127.0.0.1", "127.0.0.1"),
        ("localhost", "localhost"),
        (".localhost", "localhost"),  # a leading dot: the domain itself too, as curl
        ("example.org,*", "127.0.0.1"),  # "*" among others: no proxy at all
        ("127.0.0.1:{port}", "127.0.0.1"),  # this port only
    ],
)
def test_no_proxy_sends_direct(
    no_proxy: str,
    host: str,
    proxy: ForwardProxy,
    receiver: FhirServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy.format(port=receiver.port))
    result = _post(receiver.url.replace("127.0.0.1", host))
    assert result.outcome is Outcome.SENT, result.message
    assert proxy.seen() == []
    assert len(receiver.received) == 1


@pytest.mark.parametrize(
    "no_proxy",
    ["10.0.0.0/8", "127.0.0.2", "127.0.0.1:1", "https://127.0.0.1", "localhost.example", ""],
)
def test_a_host_no_proxy_does_not_name_goes_through_the_proxy(
    no_proxy: str, proxy: ForwardProxy, receiver: FhirServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("no_proxy", no_proxy)
    result = _post(receiver.url)
    assert result.outcome is Outcome.SENT, result.message
    assert proxy.seen() == [f"POST {receiver.url}"]


def test_a_socks_proxy_fails_a_send_in_one_line(
    receiver: FhirServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should one be set after the start: the attempt is retried with the reason, no
    traceback, nothing sent around the proxy."""
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    result = _post(receiver.url)
    assert result.outcome is Outcome.RETRY
    assert result.message == "cannot reach the FHIR server: ProxyError"
    assert receiver.received == []


@pytest.mark.parametrize("proxy_url", ["socks5://user:secret@127.0.0.1:1080", "socks://10.0.0.1"])
def test_serve_refuses_to_start_when_a_receiver_would_go_through_a_socks_proxy(
    proxy_url: str, tmp_path: Path
) -> None:
    config = config_file(tmp_path, fhir={"url": "https://fhir.hospital.example/r4"})
    env = {
        **{k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        "ALL_PROXY": proxy_url,
        "NO_PROXY": "127.0.0.1",
    }
    data = str(tmp_path / "data")
    doctor = run_radserve(
        "doctor", "--json", "--no-ports", "--config", str(config), "--data-dir", data,
        env=env, timeout=300,
    )  # fmt: skip
    [check] = [c for c in json.loads(doctor.stdout) if c["name"] == "outbound proxy"]
    assert check["status"] == "fail" and check["blocking"]
    assert check["detail"].startswith("ALL_PROXY names a SOCKS proxy (socks")
    assert "https://fhir.hospital.example/r4" in check["detail"]
    assert "secret" not in check["detail"]
    serve = run_radserve(
        "serve", "--port", "0", "--config", str(config), "--data-dir", data, env=env, timeout=300
    )
    assert serve.returncode != 0
    lines = [line for line in serve.stderr.splitlines() if "outbound proxy" in line]
    assert lines == [f"doctor: outbound proxy: {check['detail']}"]
    assert "Traceback" not in serve.stderr


def test_serve_is_not_stopped_by_a_socks_proxy_no_receiver_goes_through(
    tmp_path: Path,
) -> None:
    """A SOCKS ``ALL_PROXY`` set for other programs, the receivers listed in
    ``NO_PROXY`` or reached through ``HTTPS_PROXY``: nothing to refuse."""
    config = config_file(tmp_path, fhir={"url": "https://fhir.hospital.example/r4"})
    env = {
        **{k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        "ALL_PROXY": "socks5://127.0.0.1:1080",
        "https_proxy": "http://127.0.0.1:3128",
    }
    doctor = run_radserve(
        "doctor", "--json", "--no-ports", "--config", str(config),
        "--data-dir", str(tmp_path / "data"), env=env, timeout=300,
    )  # fmt: skip
    assert not [c for c in json.loads(doctor.stdout) if c["name"] == "outbound proxy"]
