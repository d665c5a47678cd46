"""An open, unattended console tab must sign out after ``console.idle_timeout_s``: the
live event stream (its reconnects and its session checks) and the requests the page
makes by itself (``X-Console-Background: 1``) renewed the idle time, so a worklist left
open on a shared workstation stayed signed in until the session's absolute end. Only a
person's requests renew it. Real app and sessions over HTTP; the session table's clock
is the test's."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from tests.factories.service import ServerThread, create_key, settings_for

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.console.sessions import SessionTable
from radserve.service import Service
from radserve.store.records import utc_now

IDLE_S = 20.0


class Clock:
    def __init__(self) -> None:
        self.start, self.offset_s = utc_now(), 0.0

    def __call__(self) -> dt.datetime:
        return self.start + dt.timedelta(seconds=self.offset_s)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str, Clock]]:
    service = Service(settings_for(tmp_path))
    app = create_app(service)
    install_console(app, service)
    clock = Clock()
    app.state.console_sessions = SessionTable(
        service.store, ttl_s=3600, idle_s=IDLE_S, touch_s=1.0, clock=clock
    )
    with ServerThread(app) as srv:
        yield srv.url, create_key(service.store, "read"), clock


@contextmanager
def _signed_in(url: str, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/console/api/session", json={"key": key}).status_code == 200
        yield c


def test_background_requests_do_not_keep_a_session_alive(server: tuple[str, str, Clock]) -> None:
    url, key, clock = server
    with _signed_in(url, key) as c:
        for at in (5.0, 10.0, 15.0):  # the open tab's own traffic, nobody at the desk
            clock.offset_s = at
            with c.stream("GET", "/console/api/events") as events:
                assert events.status_code == 200
                assert next(events.iter_raw()).startswith(b"retry:")
            background = {"X-Console-Background": "1"}
            assert c.get("/console/api/worklist", headers=background).status_code == 200
            assert c.get("/console/api/ops", headers=background).status_code == 200
        clock.offset_s = IDLE_S + 1  # idle since sign-in
        assert c.get("/console/api/session").status_code == 401
        assert c.get("/console/api/worklist").status_code == 401


def test_a_persons_requests_renew_the_idle_time(server: tuple[str, str, Clock]) -> None:
    url, key, clock = server
    with _signed_in(url, key) as c:
        for at in (15.0, 30.0, 45.0):
            clock.offset_s = at
            assert c.get("/console/api/worklist").status_code == 200
        clock.offset_s = 45.0 + IDLE_S - 1
        assert c.get("/console/api/session").status_code == 200
        clock.offset_s += IDLE_S + 1
        assert c.get("/console/api/session").status_code == 401
