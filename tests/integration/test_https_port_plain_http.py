"""A plain ``http://`` request to radserve's HTTPS port is answered ``400`` in the clear,
naming the ``https://`` address, with one WARNING line naming the peer; TLS clients are
served as before (keep-alive, the client-certificate check), on both event loops uvicorn
may run (uvloop, installed here, is its default; asyncio where uvloop is not).

Found on 2026-12-07: with uvicorn's own ``ssl=`` a plain request got an empty reply
(curl: "Empty reply from server", httpx: RemoteProtocolError) and the server logged
nothing. Real uvicorn servers on loopback with the protocol ``radserve serve`` gives them
(:func:`radserve.api.https_port.public_protocols`), real httpx/http.client/socket clients.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
from typing import Any

import httpx
import pytest
import uvicorn
from tests.factories.tls import HAVE_OPENSSL, Pki, make_pki
from tests.factories.waits import until

from radserve.api.https_port import public_protocols
from radserve.config import ServerSettings, TlsSettings
from radserve.tls import server_context

pytestmark = pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed")

LOGGER = "radserve.api.https_port"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers the scheme uvicorn saw, and the client's port (one per connection)."""
    if scope["type"] != "http":
        return
    body = json.dumps({"scheme": scope["scheme"], "client_port": scope["client"][1]})
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body.encode()})


class _Server:
    """uvicorn on a free loopback port with radserve's HTTPS-port protocol, in a thread."""

    def __init__(self, pki: Pki, loop: str, request_timeout_s: float = 60.0) -> None:
        server = ServerSettings(request_timeout_s=request_timeout_s)
        tls = TlsSettings(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            _app,
            loop=loop,
            log_config=None,
            lifespan="off",
            **public_protocols(server, server_context(tls, "HTTPS")),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> _Server:
        self.thread.start()
        until(lambda: self.server.started, "the test server to start", 60)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()


@pytest.fixture(params=["uvloop", "asyncio"])
def loop(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _trusted(pki: Pki, client_cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if client_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= 30]


def test_a_plain_request_is_answered_400_with_the_https_address_and_one_log_line(
    pki: Pki, loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with _Server(pki, loop) as server:
        url = f"http://127.0.0.1:{server.port}/v1/jobs?accession=ACC-SECRET-1"
        response = httpx.get(url, timeout=10)
        assert response.status_code == 400
        assert response.headers["connection"] == "close"
        error = response.json()["error"]
        assert error["code"] == "invalid_request"
        assert f"use https://127.0.0.1:{server.port}/ " in error["message"]
        # the address as the client named it (its Host header), not as the server is bound
        named = {"Host": f"radserve.example.org:{server.port}"}
        response = httpx.get(url, headers=named, timeout=10)
        assert f"https://radserve.example.org:{server.port}/" in response.json()["error"]["message"]
    lines = _warnings(caplog)
    assert lines == ["1 plain-HTTP connection(s) to the HTTPS port (last from 127.0.0.1): 400"]
    assert not any("ACC-SECRET" in r.getMessage() for r in caplog.records)


def test_a_plain_upload_still_receives_its_400(pki: Pki, loop: str) -> None:
    """What the client still sends after the answer is read and dropped: closed with
    unread bytes, the server's socket would send a reset instead of the answer."""
    with _Server(pki, loop) as server:
        body = b"\0" * 5_000_000
        url = f"http://127.0.0.1:{server.port}/dicomweb/studies"
        response = httpx.post(url, content=body, timeout=30)
        assert response.status_code == 400
        assert "speaks HTTPS only" in response.json()["error"]["message"]


def test_tls_clients_keep_their_connection_and_the_client_certificate_check(
    pki: Pki, loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with _Server(pki, loop) as server:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=_trusted(pki), timeout=10
        )
        seen = []
        for _ in range(3):
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 200
            seen.append(json.loads(response.read()))
        connection.close()
        assert {answer["scheme"] for answer in seen} == {"https"}
        assert len({answer["client_port"] for answer in seen}) == 1  # one kept-alive connection
        with pytest.raises(httpx.TransportError):  # no client certificate: refused
            httpx.get(
                f"https://127.0.0.1:{server.port}/healthz",
                verify=_trusted(pki, client_cert=False),
                timeout=10,
            )
        rogue = _trusted(pki, client_cert=False)
        rogue.load_cert_chain(str(pki.rogue_cert), str(pki.rogue_key))
        with pytest.raises(httpx.TransportError):  # a certificate from another CA
            httpx.get(f"https://127.0.0.1:{server.port}/healthz", verify=rogue, timeout=10)
        # the refusal is logged with the peer and OpenSSL's reason (it was DEBUG only);
        # the second within 10 s is counted into the next line
        refused = "TLS handshake(s) refused on the HTTPS port (last: 127.0.0.1: "
        until(lambda: any(refused in w for w in _warnings(caplog)), "the refusal's line", 30)
        [line] = [w for w in _warnings(caplog) if refused in w]
        assert line.startswith("1 ") and "CERTIFICATE" in line.upper(), line


def test_silent_and_closed_connections_are_closed_without_a_word(
    pki: Pki, loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with _Server(pki, loop, request_timeout_s=0.5) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30):
            pass  # a TCP health check
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as silent:
            assert silent.recv(1) == b""  # closed by the server after request_timeout_s
        url = f"https://127.0.0.1:{server.port}/"
        assert httpx.get(url, verify=_trusted(pki), timeout=10).json()["scheme"] == "https"
        # a connection still undecided when the server stops does not hold the stop
        undecided = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        until(lambda: server.server.server_state.connections, "the connection accepted", 30)
    assert not server.thread.is_alive()
    assert undecided.recv(1) == b""
    undecided.close()
    assert _warnings(caplog) == []
