"""Issue 16: the web console in Debian's chromium against a real ``radserve serve``:
sign-in with a good and a bad key, a read-only session without cancel buttons whose
forged cancel is refused (403), a job submitted through the API appearing and turning
green without a reload, no JavaScript errors, usable at 1280x800 and 3840x2160."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_browser()
    root = tmp_path_factory.mktemp("console")
    config = config_file(root)
    data, port = root / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("read", "submit", "admin")}
    process = start_server(config, data, port, root / "server.log")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "keys": keys, "root": root}
    finally:
        process.terminate()
        process.wait(60)


def _submit(server: dict[str, Any], folder: Path) -> str:
    with httpx.Client(base_url=server["url"], timeout=60) as c:
        r = c.post(
            "/v1/studies", files=upload(make_study(folder)), headers=auth(server["keys"]["admin"])
        )
        assert r.status_code == 202, r.text
        return str(r.json()["id"])


def test_sign_in_with_a_bad_then_a_good_key(server: dict[str, Any], tmp_path: Path) -> None:
    with browser() as b:
        p = Page(b, server["url"], tmp_path / "shots")
        p.sign_in("rsk_not_a_key")
        p.page.wait_for_selector("#signin-error:has-text('not valid')")
        assert p.page.context.cookies() == []  # no session for a bad key
        p.shot("signin-refused")
        p.sign_in(server["keys"]["read"])
        p.page.wait_for_selector("#worklist")
        [cookie] = p.page.context.cookies()
        assert cookie["name"] == "radserve_session"
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
        assert server["keys"]["read"] not in cookie["value"]
        # the key is not readable by page scripts, and the session works without it
        assert "radserve_session" not in p.page.evaluate("document.cookie")
        assert p.page.locator("#who").inner_text().endswith("read")
        p.page.click("#signout")
        p.page.wait_for_selector("#signin")
        gone = p.page.evaluate("fetch('/console/api/worklist').then(r => r.status)")
        assert gone == 401
        assert p.errors == []
        p.close()


def test_read_only_session_has_no_cancel_and_a_forged_cancel_is_refused(
    server: dict[str, Any], tmp_path: Path
) -> None:
    job_id = _submit(server, tmp_path / "study")
    with browser() as b:
        p = Page(b, server["url"], tmp_path / "shots")
        p.sign_in(server["keys"]["read"])
        p.page.wait_for_selector(f"#worklist tr[data-id='{job_id}']")
        assert p.page.locator("button[data-action=cancel]").count() == 0
        forged = p.page.evaluate(
            """async (id) => {
                const s = await (await fetch('/console/api/session')).json()
                const r = await fetch('/v1/jobs/' + id,
                    {method: 'DELETE', headers: {'X-CSRF-Token': s.csrf}})
                return [r.status, (await r.json()).error.code]
            }""",
            job_id,
        )
        assert forged == [403, "forbidden"]
        p.shot("worklist-read-only")
        assert p.errors == []
        p.close()
        # an admin session without the CSRF token is refused too (403), with it: allowed
        p = Page(b, server["url"], tmp_path / "shots")
        p.sign_in(server["keys"]["admin"])
        p.page.wait_for_selector(f"#worklist tr[data-id='{job_id}']")
        no_token = p.page.evaluate(
            "(id) => fetch('/v1/jobs/' + id, {method: 'DELETE'}).then(r => r.status)", job_id
        )
        assert no_token == 403
        p.close()


@pytest.mark.parametrize("size", ["laptop", "wall"])
def test_a_submitted_job_appears_and_turns_green_without_reload(
    server: dict[str, Any], tmp_path: Path, size: str
) -> None:
    with browser() as b:
        p = Page(b, server["url"], tmp_path / "shots", size=size)
        p.sign_in(server["keys"]["submit"])
        p.page.wait_for_selector("#live.on")
        navigations: list[str] = []
        p.page.on("framenavigated", lambda frame: navigations.append(frame.url))
        job_id = _submit(server, tmp_path / "study")
        row = f"#worklist tr[data-id='{job_id}']"
        p.page.wait_for_selector(row, timeout=ms(30))
        p.page.wait_for_selector(f"{row}[data-state=succeeded]", timeout=ms(60))
        colour = p.page.eval_on_selector(row, "el => getComputedStyle(el).backgroundColor")
        r, g, b_ = (int(v) for v in colour[colour.index("(") + 1 :].split(",")[:3])
        assert g > r and g > b_, colour  # green
        assert navigations == []  # no reload
        # usable: the table fits the viewport width and the text is readable
        width = p.page.evaluate("document.documentElement.scrollWidth")
        assert width <= p.page.viewport_size["width"]
        font = p.page.evaluate("parseFloat(getComputedStyle(document.body).fontSize)")
        assert font >= (13 if size == "laptop" else 24)
        p.shot(f"worklist-{size}")
        assert p.errors == []
        p.close()
