"""Issue 16: signing in to the console as a local user (``console.users``, a scrypt hash
from ``radserve console hash-password``) in Debian's chromium against a real ``radserve
serve``: a wrong password is refused, a right one opens the same HttpOnly session as an
API key with the user's role, and no password reaches the server's log."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tests.factories.console import Page, browser, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.server_process import start_server
from tests.factories.service import config_file

from radserve.passwords import hash_password

pytestmark = pytest.mark.slow

PASSWORDS = {"alice": "alice-wall-screen-1", "bob": "bob-reads-only-22"}
ROLES = {"alice": "admin", "bob": "read"}


def test_local_users_sign_in_with_their_password_and_role(tmp_path: Path) -> None:
    need_browser()
    users = [
        {"username": n, "role": ROLES[n], "password_hash": hash_password(p)}
        for n, p in PASSWORDS.items()
    ]
    config = config_file(tmp_path, console={"users": users})
    data, port, log = tmp_path / "data", free_port(), tmp_path / "server.log"
    process = start_server(config, data, port, log)
    try:
        with browser() as b:
            p = Page(b, f"http://127.0.0.1:{port}", tmp_path / "shots")
            page = p.goto("/")
            page.wait_for_selector("#signin-user")
            assert page.locator("#signin").count() == 1  # API keys still work
            page.fill("#username", "bob")
            page.fill("#password", "not-bobs-password")
            page.click("#signin-user button[type=submit]")
            page.wait_for_selector("#signin-user-error:has-text('wrong password')")
            assert page.input_value("#password") == ""  # not kept in the page
            assert p.page.context.cookies() == []
            p.shot("signin-user-refused")
            page.fill("#username", "bob")
            page.fill("#password", PASSWORDS["bob"])
            page.click("#signin-user button[type=submit]")
            page.wait_for_selector("#worklist")
            assert page.locator("#who").inner_text() == "bob · read"
            [cookie] = p.page.context.cookies()
            assert cookie["name"] == "radserve_session" and cookie["httpOnly"]
            assert cookie["sameSite"] == "Strict"
            assert PASSWORDS["bob"] not in cookie["value"]
            assert page.locator("button[data-action=cancel]").count() == 0
            # the sign-in form is built once at sign-out: before, the sign-out and the
            # route its hash change ran each built one, the second replacing the first
            # while it was being filled in (CI saw alice's click land on an empty form)
            page.evaluate(
                "() => { window.__built = 0; new MutationObserver((records) => {"
                " for (const r of records) for (const n of r.addedNodes)"
                " if (n.id === 'signin-user') window.__built++ })"
                ".observe(document.getElementById('app'), { childList: true }) }"
            )
            page.click("#signout")
            page.wait_for_selector("#signin-user")
            page.wait_for_load_state("networkidle")
            assert page.evaluate("window.__built") == 1
            page.fill("#username", "alice")
            page.fill("#password", PASSWORDS["alice"])
            page.click("#signin-user button[type=submit]")
            page.wait_for_selector("#worklist")
            assert page.locator("#who").inner_text() == "alice · admin"
            p.goto("/#/ops")
            page.wait_for_selector("#outbox h2:has-text('Outbox')")  # admin: the outbox
            page.wait_for_selector("#outbox table")
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)
    text = log.read_text()
    for secret in [*PASSWORDS.values(), "not-bobs-password"]:
        assert secret not in text


def _sign_in(page, user: str) -> None:
    page.wait_for_selector("#signin-user")
    page.fill("#username", user)
    page.fill("#password", PASSWORDS[user])
    page.click("#signin-user button[type=submit]")
    page.wait_for_selector(f"#who:has-text('{user} · {ROLES[user]}')")


def test_an_answer_to_the_ended_session_does_not_sign_out_the_next_user(tmp_path: Path) -> None:
    """bob's worklist refresh is in flight when he signs out; the server answers it 401
    (his session is gone) only after alice has signed in. Before, that late 401 signed
    alice out too: the console took any 401 as the end of the current session (CI saw
    it once: alice's worklist never came)."""
    need_browser()
    users = [
        {"username": n, "role": ROLES[n], "password_hash": hash_password(p)}
        for n, p in PASSWORDS.items()
    ]
    config = config_file(tmp_path, console={"users": users})
    data, port = tmp_path / "data", free_port()
    process = start_server(config, data, port, tmp_path / "server.log")
    try:
        with browser() as b:
            p = Page(b, f"http://127.0.0.1:{port}", tmp_path / "shots")
            page = p.goto("/")
            _sign_in(page, "bob")
            page.wait_for_selector("#worklist")
            [bob] = p.page.context.cookies()
            held: list = []

            def hold_once(route) -> None:
                if held:  # alice's own worklist loads go through
                    route.continue_()
                else:
                    held.append(route)

            page.route("**/console/api/worklist*", hold_once)
            page.select_option("#f-state", "succeeded")  # bob's page reloads its list
            for _ in range(100):
                if held:
                    break
                page.wait_for_timeout(50)
            assert held, "the worklist reload was not sent"
            page.click("#signout")
            _sign_in(page, "alice")
            page.wait_for_selector("#worklist")
            # the held request reaches the real server with bob's ended session (Chromium
            # would attach alice's cookie to it now), and its answer to the page
            stale = httpx.get(held[0].request.url, cookies={bob["name"]: bob["value"]})
            assert stale.status_code == 401, stale.text
            with page.expect_response(lambda r: "state=succeeded" in r.url) as answer:
                held[0].fulfill(
                    status=stale.status_code,
                    headers=dict(stale.headers),
                    body=stale.content,
                )
            assert answer.value.status == 401
            page.evaluate("() => new Promise((done) => setTimeout(done, 300))")
            assert page.locator("#signin-user").count() == 0, "alice was signed out"
            assert page.locator("#who").inner_text() == "alice · admin"
            assert page.locator("#worklist").count() == 1
            p.close()
    finally:
        process.terminate()
        process.wait(60)
