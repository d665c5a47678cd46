"""`radserve serve` over HTTPS from ``server.tls`` settings, checked with httpx against the
test's own CA: TLS 1.2+ only, and with ``server.tls.ca`` mutual TLS (API clients without a
certificate signed by that CA are refused). Mutual TLS is served by 2 API reader processes
(the default layout on 2 cores), TLS without client certificates by one process."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.serve import RadserveServe
from tests.factories.server_process import create_key_cli
from tests.factories.service import config_file
from tests.factories.tls import HAVE_OPENSSL, Pki, handshake, make_pki, tls_1_1_is_possible_here
from tests.factories.waits import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def _serve(
    tmp_path: Path, tls: dict[str, object], verify: ssl.SSLContext, port: int, readers: int = 0
):
    """``readers``: API reader processes, which then terminate TLS on the public port."""
    config = config_file(tmp_path, server={"tls": tls, "read_processes": readers})
    return RadserveServe(config, tmp_path / "data", port, tmp_path / "serve.log", verify=verify)


def test_https_with_client_certificates(tmp_path: Path, pki: Pki) -> None:
    tls = {"cert": str(pki.server_cert), "key": str(pki.server_key), "ca": str(pki.ca)}
    trusted = _client_context(pki.ca, pki.client_cert, pki.client_key)
    port = free_port()
    with _serve(tmp_path, tls, trusted, port, readers=2) as server:  # the default on 2 cores
        assert "radserve serving on https://" in server.log.read_text()
        response = httpx.get(f"{server.url}/healthz", verify=trusted, timeout=10)
        assert response.status_code == 200
        refused = {
            "no client certificate": _client_context(pki.ca),
            "certificate from another CA": _client_context(pki.ca, pki.rogue_cert, pki.rogue_key),
        }
        for what, context in refused.items():
            with pytest.raises(httpx.TransportError):
                httpx.get(f"{server.url}/healthz", verify=context, timeout=10)
                pytest.fail(f"answered a client with {what}")
        plain = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)  # plain HTTP
        assert plain.status_code == 400  # from a reader: tests/e2e/test_serve_https_plain_http.py
        assert f"use https://127.0.0.1:{port}/" in plain.json()["error"]["message"]
        line = "plain-HTTP connection(s) to the HTTPS port (last from 127.0.0.1): 400"
        until(lambda: line in server.log.read_text(), "the reader's log line")
        assert tls_1_1_is_possible_here(pki)
        address = ("127.0.0.1", port)
        assert handshake(address, pki, maximum=ssl.TLSVersion.TLSv1_1).startswith("refused")
        assert handshake(address, pki, maximum=ssl.TLSVersion.TLSv1_2) == "TLSv1.2"


def test_https_without_client_authentication(tmp_path: Path, pki: Pki) -> None:
    tls = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
    verify = _client_context(pki.ca)
    with _serve(tmp_path, tls, verify, free_port()) as server:
        assert httpx.get(f"{server.url}/healthz", verify=verify, timeout=10).status_code == 200
        with pytest.raises(httpx.TransportError):  # the server's certificate is checked
            httpx.get(f"{server.url}/healthz", verify=_client_context(pki.rogue_cert), timeout=10)
        # the console's session cookie is Secure under the server's own TLS, and its
        # same-origin check wants the https origin (docs/security.md)
        key = create_key_cli(tmp_path / "radserve.yaml", tmp_path / "data", "read")
        with httpx.Client(base_url=server.url, verify=verify, timeout=10) as c:
            http_origin = {"Origin": server.url.replace("https://", "http://")}
            r = c.post("/console/api/session", json={"key": key}, headers=http_origin)
            assert r.status_code == 403
            r = c.post("/console/api/session", json={"key": key}, headers={"Origin": server.url})
            cookie = r.headers["set-cookie"].lower()
            assert "; secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
            assert r.headers["strict-transport-security"].startswith("max-age=")
            # named __Host-: no other application on the host or a parent domain can set
            # it; a plain radserve_session cookie (one another site could plant) is not read
            assert cookie.startswith("__host-radserve_session=") and "; path=/" in cookie
            session_id = r.cookies["__Host-radserve_session"]
        for name, answer in (("radserve_session", 401), ("__Host-radserve_session", 200)):
            with httpx.Client(
                base_url=server.url, verify=verify, timeout=10, cookies={name: session_id}
            ) as c:
                assert c.get("/console/api/session").status_code == answer, name
