"""Issue 16: the console behind a load balancer. Two real ``radserve serve`` replicas on
one PostgreSQL database (a fresh one), B with an API reader process in front of its
serving process: a browser signed in through A is signed in on B (and the reverse); a
sign-out or a key's revocation through one ends the session on the other at once; a
local user B's settings do not list is refused there, and one removed from A's
settings file while A runs is refused by A at once; failed sign-ins through both count
against one limit. Plain HTTP clients, each with its own cookie jar (cookies
ignore the port, as a browser's do behind one load-balanced name).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy import create_engine
from tests.factories.dicom_net import free_port
from tests.factories.replicas import fresh_database, replica_config, rows_of
from tests.factories.server_process import create_key_cli, start_server, stop_servers

from radserve.commands.keys import group as keys_group
from radserve.passwords import hash_password
from radserve.security.keys import parse_token
from radserve.store.db import normalise_url

pytestmark = pytest.mark.slow

PASSWORDS = {"alice": "alice-wall-screen-1", "bob": "bob-reads-only-22"}
ROLES = {"alice": "admin", "bob": "read"}
MAX_FAILURES = 4


def _users(*names: str, hashes: dict[str, str]) -> list[dict[str, str]]:
    return [{"username": n, "role": ROLES[n], "password_hash": hashes[n]} for n in names]


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def test_console_sessions_and_the_sign_in_limit_are_shared_by_replicas(
    tmp_path: Path, database_url: str
) -> None:
    hashes = {n: hash_password(p) for n, p in PASSWORDS.items()}
    limit = {"signin_max_failures": MAX_FAILURES, "signin_window_s": 300.0}
    common: dict[str, Any] = {"job_lease_s": 15.0, "outbox_lease_s": 15.0, "slow": False}
    # B no longer lists bob (removed from its settings); A still does
    config_a = replica_config(
        tmp_path,
        "a",
        database_url,
        None,
        **common,
        console={"users": _users("alice", "bob", hashes=hashes), **limit},
    )
    config_b = replica_config(
        tmp_path,
        "b",
        database_url,
        None,
        **common,
        console={"users": _users("alice", hashes=hashes), **limit},
        server={"read_processes": 1},  # console requests reach B's reader first
    )
    data = tmp_path / "data"
    admin_key = create_key_cli(config_a, data, "admin")
    read_key = create_key_cli(config_a, data, "read")
    port_a, port_b = free_port(), free_port()
    a_url, b_url = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    servers: list[subprocess.Popen[bytes]] = []
    try:
        servers.append(start_server(config_a, data, port_a, tmp_path / "a.log"))
        servers.append(start_server(config_b, data, port_b, tmp_path / "b.log"))

        def sign_in(c: httpx.Client, base: str, **body: str) -> httpx.Response:
            return c.post(f"{base}/console/api/session", json=body, headers={"Origin": base})

        def who(c: httpx.Client, base: str) -> httpx.Response:
            return c.get(f"{base}/console/api/session")

        # an API key's session: signed in on A, used on B (a read and a CSRF'd write)
        with httpx.Client(timeout=60) as browser:
            signed = sign_in(browser, a_url, key=admin_key)
            assert signed.status_code == 200, signed.text
            csrf = {"X-CSRF-Token": signed.json()["csrf"]}
            on_b = who(browser, b_url)
            assert on_b.status_code == 200, on_b.text
            assert (on_b.json()["role"], on_b.json()["csrf"]) == ("admin", csrf["X-CSRF-Token"])
            assert browser.get(f"{b_url}/console/api/worklist").status_code == 200
            # the worklist's event stream open on A: the sign-out through B ends it
            stream = _EventStream(f"{a_url}/console/api/events", dict(browser.cookies))
            # signed out through B: refused on A at its next request
            out = browser.delete(f"{b_url}/console/api/session", headers={**csrf, "Origin": b_url})
            assert out.status_code == 204, out.text
            browser.cookies.set("radserve_session", signed.cookies["radserve_session"])
            assert who(browser, a_url).status_code == 401
            assert who(browser, b_url).status_code == 401
            stream.join()
            assert stream.events[0] == "hello" and stream.events[-1] == "ended", stream.events

        # a key revoked (the CLI, on the shared database) ends its session everywhere
        with httpx.Client(timeout=60) as browser:
            assert sign_in(browser, b_url, key=read_key).status_code == 200
            assert who(browser, a_url).json()["role"] == "read"
            key_id = parse_token(read_key)[0]  # type: ignore[index]
            args = ["revoke", key_id, "--config", str(config_a), "--data-dir", str(data)]
            revoked = CliRunner().invoke(keys_group, args, catch_exceptions=False)
            assert revoked.exit_code == 0, revoked.output
            assert who(browser, a_url).status_code == 401
            assert who(browser, b_url).status_code == 401

        # local users: alice (on both) signs in on B and is known on A; bob signs in on
        # A, and B, whose settings do not list him, ends his session
        with httpx.Client(timeout=60) as alice, httpx.Client(timeout=60) as bob:
            r = sign_in(alice, b_url, username="alice", password=PASSWORDS["alice"])
            assert r.status_code == 200, r.text
            assert who(alice, a_url).json()["user"] == "alice"
            r = sign_in(bob, a_url, username="bob", password=PASSWORDS["bob"])
            assert r.status_code == 200, r.text
            assert who(bob, b_url).status_code == 401
            assert who(bob, a_url).status_code == 401  # ended, not just refused on B
            refused = sign_in(bob, b_url, username="bob", password=PASSWORDS["bob"])
            assert refused.status_code == 401  # failure 1
            # bob removed from A's settings file while A runs: no restart
            assert sign_in(bob, a_url, username="bob", password=PASSWORDS["bob"]).is_success
            assert who(bob, a_url).json()["user"] == "bob"
            settings = yaml.safe_load(config_a.read_text())
            settings["console"]["users"] = _users("alice", hashes=hashes)
            config_a.write_text(yaml.safe_dump(settings))
            assert who(bob, a_url).status_code == 401
            refused = sign_in(bob, a_url, username="bob", password=PASSWORDS["bob"])
            assert refused.status_code == 401  # failure 2
            assert who(alice, a_url).json()["user"] == "alice"  # her account did not change

        # failed sign-ins through A and B count against one limit (two failures above)
        with httpx.Client(timeout=60) as guesser:
            for i in range(MAX_FAILURES - 2):
                base = (a_url, b_url)[i % 2]
                assert sign_in(guesser, base, key=f"rsk_guess-{i}").status_code == 401
            for base in (a_url, b_url):
                blocked = sign_in(guesser, base, username="alice", password=PASSWORDS["alice"])
                assert blocked.status_code == 429, blocked.text
                assert 0 < int(blocked.headers["retry-after"]) <= 300
        assert "console.users re-read from" in (tmp_path / "a.log").read_text()
    finally:
        stop_servers(servers)

    rows = rows_of(create_engine(normalise_url(database_url)))
    assert rows("SELECT count(*) FROM console_signin_failures")[0][0] == MAX_FAILURES
    locked = rows("SELECT count(*) FROM audit_records WHERE action = 'console.signin_locked'")
    assert locked[0][0] == 1
    # only digests: no session id from a cookie is in the table
    digests = [r[0] for r in rows("SELECT digest FROM console_sessions")]
    assert all(len(d) == 64 for d in digests)


class _EventStream(threading.Thread):
    """A console event stream read in a thread: the names of its events, in order
    (started and open once its ``hello`` came)."""

    def __init__(self, url: str, cookies: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.cookies = url, cookies
        self.events: list[str] = []
        self.opened = threading.Event()
        self.start()
        assert self.opened.wait(60), "the event stream did not open"

    def run(self) -> None:
        try:
            with (
                httpx.Client(cookies=self.cookies, timeout=60) as client,
                client.stream("GET", self.url) as answer,
            ):
                for line in answer.iter_lines():
                    if line.startswith("event: "):
                        self.events.append(line.removeprefix("event: "))
                        self.opened.set()
        finally:
            self.opened.set()

    def join(self, timeout: float | None = 60) -> None:
        super().join(timeout)
        assert not self.is_alive(), "the event stream did not end"
