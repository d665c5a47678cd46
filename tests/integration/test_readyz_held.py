"""``/readyz`` of a replica whose job leases cannot be renewed (a private PostgreSQL
server stopped and started again, never the machine's shared one): not ready, naming
the held work and for how long, and ready again once the leases are renewed. Before
session 17 the held scheduler showed nowhere but in one log line.

The key is remembered for the test's length (``key_ttl_s``), so the first test sees the
whole body. A key that must be checked during the outage (the second test) cannot be:
``/readyz`` answers at once, 503 and not ready, with only the parts that need no key
(it used to wait ``server.store_wait_s`` and answer 503 ``store_error``), and the
outage is logged once when it starts and once when it ends, not once per probe (six
warnings a minute at a 10 s probe period before session 19).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.service import ServerThread, auth, create_key, settings_for
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.service import Service
from radserve.service.leases import HELD_REASON

WAIT_S = 120.0


def test_readyz_names_the_held_work_until_the_leases_are_renewed(tmp_path: Path) -> None:
    with PrivatePostgres() as pg:
        settings = settings_for(
            tmp_path,
            database_url=pg.url,
            jobs__lease_s=3.0,  # proven for 2 s after the last renewal
            outbox__replicas=2,  # only replicas hold their work
            outbox__instance_id="replica-a",
        )
        service = Service(settings)
        key = create_key(service.store, "admin")
        with (
            ServerThread(create_app(service, key_ttl_s=3600)) as srv,
            httpx.Client(base_url=srv.url, headers=auth(key), timeout=60) as c,
        ):
            assert service.wait_warm(120 * WAIT_SCALE)
            ready = until(lambda: _ready(c, 200), "the server to be ready", WAIT_S)
            assert ready["work_held"] is None and ready["work_held_seconds"] == 0.0

            pg.shut_down()
            try:
                held = until(
                    lambda: _ready(c, 503, work_held=HELD_REASON),
                    "/readyz to name the held work",
                    WAIT_S,
                    step=0.2,
                )
                reasons = " | ".join(held["reasons"])
                assert "the database does not answer" in reasons
                assert "no new work starts, for" in reasons
                assert "the job leases could not be renewed" in reasons
                later = until(
                    lambda: _longer(c, held["work_held_seconds"]),
                    "the held time to grow",
                    WAIT_S,
                    step=0.2,
                )
                assert later["work_held"] == HELD_REASON
            finally:
                pg.start_again()
            again = until(lambda: _ready(c, 200), "/readyz to be ready again", WAIT_S)
            assert again["work_held"] is None and again["work_held_seconds"] == 0.0
        service.stop()


def test_readyz_answers_at_once_when_the_key_cannot_be_checked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with PrivatePostgres() as pg:
        settings = settings_for(
            tmp_path,
            database_url=pg.url,
            server__store_wait_s=300.0,  # the old answer came after this wait
        )
        service = Service(settings)
        key = create_key(service.store, "read")
        with (
            # no memory of checked keys: every /readyz checks its key in the database
            ServerThread(create_app(service, key_ttl_s=0)) as srv,
            httpx.Client(base_url=srv.url, timeout=60) as c,
        ):
            assert service.wait_warm(120 * WAIT_SCALE)
            until(lambda: _ready(c, 200, headers=auth(key)), "the server to be ready", WAIT_S)
            wrong = key[:-1] + ("A" if key[-1] != "A" else "B")  # a wrong secret
            assert c.get("/readyz", headers=auth(wrong)).status_code == 401

            pg.shut_down()
            try:
                # a malformed key needs no database to be refused
                assert c.get("/readyz", headers=auth("rsk_not-a-key")).status_code == 401
                for token in (key, wrong):  # these cannot be told apart now
                    answer = c.get("/readyz", headers=auth(token))
                    assert answer.status_code == 503
                    body = answer.json()
                    assert body["ready"] is False and body["store_reachable"] is False
                    assert body["warmed_up"] is True
                    assert body["open_models"] == [] and body["failed_models"] == {}
                    assert body["unreachable_peers"] == {}
                    reasons = " | ".join(body["reasons"])
                    assert "the database does not answer" in reasons
                    assert "the API key could not be checked" in reasons
                assert len(_key_check_lines(caplog)) == 1  # two probes, one line
                assert "failed (store_error" in _key_check_lines(caplog)[0]
            finally:
                pg.start_again()
            again = until(lambda: _ready(c, 200, headers=auth(key)), "ready again", WAIT_S)
            assert "the API key could not be checked" not in " | ".join(again["reasons"])
            lines = _key_check_lines(caplog)
            assert len(lines) == 2 and "works again after" in lines[1]
            assert c.get("/readyz", headers=auth(key)).status_code == 200
            assert len(_key_check_lines(caplog)) == 2
        service.stop()


def _key_check_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "radserve.api.auth" and "API key checks without a wait" in r.getMessage()
    ]


def _ready(
    c: httpx.Client, status: int, headers: dict[str, str] | None = None, **fields: Any
) -> dict[str, Any] | None:
    answer = c.get("/readyz", headers=headers)
    body: dict[str, Any] = answer.json()
    if answer.status_code != status or any(body.get(k) != v for k, v in fields.items()):
        return None
    return body


def _longer(c: httpx.Client, than: float) -> dict[str, Any] | None:
    body: dict[str, Any] = c.get("/readyz").json()
    return body if body["work_held_seconds"] > than else None
