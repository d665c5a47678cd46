"""Console sign-in as a local user (``console.users``) over HTTP against a real server:
the same session cookie, CSRF and roles as an API key; failed sign-ins audited without
what was typed, and rate limited per client (429 with Retry-After), guesses sent at once
included."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.service import (
    ServerThread,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.console.limits import SignInLimiter
from radserve.passwords import hash_password
from radserve.service import Service
from radserve.store.records import utc_now

pytestmark = pytest.mark.slow

PASSWORDS = {"alice": "alice-wall-screen-1", "bob": "bob-reads-only-22"}
ROLES = {"alice": "admin", "bob": "read"}


class Server:
    def __init__(self, root: Path, *, users: bool = True) -> None:
        users_setting = [
            {"username": n, "role": ROLES[n], "password_hash": hash_password(p)}
            for n, p in PASSWORDS.items()
        ]
        self.service = Service(settings_for(root, console__users=users_setting if users else []))
        self.app = create_app(self.service)
        install_console(self.app, self.service)  # as radserve serve does
        self.now, start = [0.0], utc_now()
        self.app.state.console_limiter = SignInLimiter(
            self.service.store,
            max_failures=3,
            window_s=300,
            clock=lambda: start + dt.timedelta(seconds=self.now[0]),
        )
        self.thread = ServerThread(self.app)

    def audit(self, *actions: str) -> list[Any]:
        return [r for r in self.service.store.iter_audit() if r.action in actions]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    with s.thread:
        yield s


def _sign_in(c: httpx.Client, **body: str) -> httpx.Response:
    return c.post("/console/api/session", json=body)


def test_a_user_gets_the_same_session_csrf_and_roles_as_a_key(
    server: Server, tmp_path: Path
) -> None:
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        assert c.get("/console/api/signin").json() == {"methods": ["key", "password"]}
        r = _sign_in(c, username="bob", password=PASSWORDS["bob"])
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["role"], body["user"], body["phi"]) == ("read", "bob", False)
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "max-age=" in cookie
        assert PASSWORDS["bob"] not in r.text
        assert c.get("/console/api/worklist").status_code == 200
        csrf = {"X-CSRF-Token": body["csrf"]}
        # a read user may not change deployments: refused by the API's own role check
        promote = c.post("/v1/models/lesions-test/promote", json={"reason": "x"}, headers=csrf)
        assert promote.status_code == 403 and "admin" in promote.text
        assert c.post("/v1/studies", files=upload(make_study(tmp_path / "r"))).status_code == 403
        assert c.delete("/console/api/session", headers=csrf).status_code == 204
        assert c.get("/console/api/worklist").status_code == 401

    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        # user names are matched without case; the session is alice's
        body = _sign_in(c, username="ALICE", password=PASSWORDS["alice"]).json()
        assert (body["role"], body["user"], body["phi"]) == ("admin", "alice", True)
        files = upload(make_study(tmp_path / "s"))
        assert c.post("/v1/studies", files=files).status_code == 403  # no CSRF token
        r = c.post("/v1/studies", files=files, headers={"X-CSRF-Token": body["csrf"]})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        admin_key = create_key(server.service.store, "admin")
        assert wait_job(c, job_id, admin_key)["state"] == "succeeded"
        # the session sees the job its user submitted, with the user as its submitter
        assert c.get(f"/v1/jobs/{job_id}").status_code == 200
    submitted = [r for r in server.service.store.iter_audit() if r.subject == job_id]
    assert submitted and submitted[0].actor_key_id == "user:alice"
    signins = [(r.actor_key_id, dict(r.payload)) for r in server.audit("console.signin")]
    assert signins == [
        ("user:bob", {"method": "password", "user": "bob"}),
        ("user:alice", {"method": "password", "user": "alice"}),
    ]
    assert [r.actor_key_id for r in server.audit("console.signout")] == ["user:bob"]


def test_failed_sign_ins_are_audited_without_secrets_and_rate_limited(server: Server) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    typed = [
        {"username": "bob", "password": "bob-guess-number-1"},  # a configured user
        {"username": PASSWORDS["bob"], "password": "x"},  # a password in the name field
        {"key": "rsk_not-a-key-at-all"},
    ]
    try:
        with httpx.Client(base_url=server.thread.url, timeout=60) as c:
            for body in typed:
                r = _sign_in(c, **body)
                assert r.status_code == 401, r.text
                assert "set-cookie" not in r.headers
                wanted = "not valid" if "key" in body else "unknown user name or wrong password"
                assert wanted in r.json()["error"]["message"]
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    # three failures: now even the right password is refused, without being checked
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        r = _sign_in(c, username="bob", password=PASSWORDS["bob"])
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_signins"
        assert int(r.headers["retry-after"]) == 300
        server.now[0] = 299.0
        assert int(_sign_in(c, key="rsk_x").headers["retry-after"]) == 1
        server.now[0] = 300.0  # the failures have left the window
        assert _sign_in(c, username="bob", password=PASSWORDS["bob"]).status_code == 200

    failed = [dict(r.payload) for r in server.audit("console.signin_failed")]
    assert failed == [
        {"method": "password", "user": "bob"},
        {"method": "password"},  # an unknown name is not recorded
        {"method": "key"},
    ]
    [locked] = server.audit("console.signin_locked")
    assert dict(locked.payload) == {"failures": 3, "window_s": 300.0}
    everything = json.dumps([r.to_json() for r in server.service.store.iter_audit()])
    logs = stream.getvalue()
    for secret in [*PASSWORDS.values(), "bob-guess-number-1", "rsk_not-a-key-at-all"]:
        assert secret not in everything
        assert secret not in logs
    assert "failures from one client" in logs


def test_user_sign_in_on_a_server_without_users_is_a_clear_error(tmp_path: Path) -> None:
    s = Server(tmp_path, users=False)
    with s.thread, httpx.Client(base_url=s.thread.url, timeout=60) as c:
        assert c.get("/console/api/signin").json() == {"methods": ["key"]}
        r = _sign_in(c, username="alice", password=PASSWORDS["alice"])
        assert r.status_code == 400 and "console.users" in r.json()["error"]["message"]
        both = _sign_in(c, key="rsk_x", username="alice", password="y")
        assert both.status_code == 400 and "not both" in both.text
        assert "rsk_x" not in both.text
        assert _sign_in(c, username="alice").status_code == 400


def test_guesses_sent_at_once_get_no_more_checks_than_the_limit(server: Server) -> None:
    """30 wrong passwords for one user sent at once from one address against a limit of
    3: 3 are checked (401), the others refused unchecked (429), and then the right
    password is refused too. Before 2026-12-06 the count was read before each password
    was checked and the failure counted after: all 30 were checked."""
    start = threading.Barrier(30)

    def guess(i: int) -> int:
        with httpx.Client(base_url=server.thread.url, timeout=120) as c:
            start.wait()
            return _sign_in(c, username="bob", password=f"bob-guess-{i:04d}").status_code

    with ThreadPoolExecutor(30) as pool:
        answers = Counter(pool.map(guess, range(30)))
    assert answers == {401: 3, 429: 27}
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        assert _sign_in(c, username="bob", password=PASSWORDS["bob"]).status_code == 429
    assert len(server.audit("console.signin_failed")) == 3
    assert len(server.audit("console.signin_locked")) == 1


def test_a_right_password_after_wrong_ones_signs_in_and_forgives_only_itself(
    server: Server,
) -> None:
    with httpx.Client(base_url=server.thread.url, timeout=60) as c:
        assert _sign_in(c, username="bob", password="bob-guess-0001").status_code == 401
        for _ in range(3):  # a success is no failure: signing in again and again is fine
            assert _sign_in(c, username="bob", password=PASSWORDS["bob"]).status_code == 200
        assert _sign_in(c, username="bob", password="bob-guess-0002").status_code == 401
        # the earlier two failures still count: the third blocks
        assert _sign_in(c, key="rsk_not-a-key").status_code == 401
        assert _sign_in(c, username="bob", password=PASSWORDS["bob"]).status_code == 429
