"""The API reference page (``/docs``) runs Swagger UI from this server, in a real browser
(Debian's chromium): every request the page makes goes to radserve's own origin, the
operations render, and the page's policy allows no script from elsewhere.

Before 2026-12-07 it was FastAPI's default page, which loaded Swagger UI's script and
style from cdn.jsdelivr.net into radserve's origin: third-party script running with a
signed-in browser's rights, and a blank page on a hospital network that reaches no CDN."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from tests.factories.console import browser, ms, need_browser
from tests.factories.service import ServerThread, auth, create_key, settings_for

from radserve.api import create_app
from radserve.service import Service

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("api-docs")
    service = Service(settings_for(root))
    key = create_key(service.store, "read")
    with ServerThread(create_app(service, manage_service=False)) as srv:
        yield {"url": srv.url, "key": key}
    service.store.close()


def test_the_page_names_only_this_server_s_files(live: dict[str, Any]) -> None:
    with httpx.Client(base_url=live["url"], timeout=30) as c:
        assert c.get("/docs").status_code == 401  # the page, as the schema, needs a key
        page = c.get("/docs", headers=auth(live["key"]))
        assert page.status_code == 200
        assert "cdn" not in page.text and "http" not in page.text.lower().replace("https", "")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-eval" not in policy
        for asset in ("/docs/static/swagger/swagger-ui-bundle.js", "/docs/static/docs.js"):
            answer = c.get(asset)  # public, as any static script
            assert answer.status_code == 200, asset
            assert "javascript" in answer.headers["content-type"]


def test_the_page_renders_the_operations_from_this_origin_only(
    live: dict[str, Any], tmp_path: Path
) -> None:
    need_browser()
    origin = urlsplit(live["url"]).netloc
    with browser() as b:
        context = b.new_context(extra_http_headers={"Authorization": f"Bearer {live['key']}"})
        page = context.new_page()
        hosts: list[str] = []
        errors: list[str] = []
        page.on("request", lambda request: hosts.append(urlsplit(request.url).netloc))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(live["url"] + "/docs", timeout=ms(30))
        page.wait_for_selector(".opblock", timeout=ms(60))
        operations = page.locator(".opblock-summary-path").all_inner_texts()
        context.close()
    assert "/v1/studies" in operations and "/v1/jobs/{job_id}" in operations
    assert set(hosts) == {origin}, hosts
    assert not errors, errors
