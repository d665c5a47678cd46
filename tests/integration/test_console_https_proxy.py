"""Behind a trusted TLS-terminating proxy (``server.trusted_proxies``, which says
``X-Forwarded-Proto: https``) the console's session cookie must be ``Secure`` (it was
set from ``server.tls`` only), every https answer carries ``Strict-Transport-Security``,
and the same-origin check compares the scheme (``Origin: http://host`` was accepted on
an HTTPS server). A client the server does not trust cannot claim https. Real app over
HTTP from 127.0.0.1, the proxy's address."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.factories.service import ServerThread, create_key, settings_for

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.service import Service

HTTPS = {"X-Forwarded-Proto": "https"}


def _server(root: Path, **overrides: object) -> tuple[ServerThread, str]:
    service = Service(settings_for(root, **overrides))
    app = create_app(service)
    install_console(app, service)
    return ServerThread(app), create_key(service.store, "read")


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[str, str]]:
    server, key = _server(tmp_path, server__trusted_proxies=["127.0.0.1"])
    with server:
        yield server.url, key


def _sign_in(url: str, key: str, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=60) as c:
        return c.post("/console/api/session", json={"key": key}, headers=headers)


def test_https_through_a_trusted_proxy_gives_a_secure_cookie_and_hsts(
    proxied: tuple[str, str],
) -> None:
    url, key = proxied
    host = url.removeprefix("http://")
    r = _sign_in(url, key, {**HTTPS, "Origin": f"https://{host}"})
    assert r.status_code == 200, r.text
    cookie = r.headers["set-cookie"].lower()
    assert "; secure" in cookie and "httponly" in cookie
    assert r.headers["strict-transport-security"].startswith("max-age=")
    with httpx.Client(base_url=url, timeout=60) as c:
        for path in ("/healthz", "/console/api/signin", "/v1/jobs"):
            answer = c.get(path, headers={**HTTPS, "Authorization": f"Bearer {key}"})
            assert "strict-transport-security" in answer.headers, path

    # the page's origin must be the server's scheme too
    refused = _sign_in(url, key, {**HTTPS, "Origin": f"http://{host}"})
    assert refused.status_code == 403, refused.text
    assert "set-cookie" not in refused.headers

    # plain http through the same proxy: no Secure (the browser would drop the cookie)
    plain = _sign_in(url, key, {"Origin": f"http://{host}"})
    assert plain.status_code == 200, plain.text
    assert "secure" not in plain.headers["set-cookie"].lower()
    assert "strict-transport-security" not in plain.headers
    assert _sign_in(url, key, {"Origin": f"https://{host}"}).status_code == 403


def test_an_untrusted_client_cannot_claim_https(tmp_path: Path) -> None:
    server, key = _server(tmp_path)  # no trusted proxies: X-Forwarded-Proto ignored
    with server:
        r = _sign_in(server.url, key, HTTPS)
        assert r.status_code == 200, r.text
        assert "secure" not in r.headers["set-cookie"].lower()
        assert "strict-transport-security" not in r.headers
