"""``/readyz`` of a replica whose job leases cannot be renewed (a private PostgreSQL
server stopped and started again, never the machine's shared one): not ready, naming
the held work and for how long, and ready again once the leases are renewed. Before
session 17 the held scheduler showed nowhere but in one log line.

The key is remembered for the test's length (``key_ttl_s``): a key checked during the
outage would wait for the database (``server.store_wait_s``) before ``/readyz`` ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
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


def _ready(c: httpx.Client, status: int, **fields: Any) -> dict[str, Any] | None:
    answer = c.get("/readyz")
    body: dict[str, Any] = answer.json()
    if answer.status_code != status or any(body.get(k) != v for k, v in fields.items()):
        return None
    return body


def _longer(c: httpx.Client, than: float) -> dict[str, Any] | None:
    body: dict[str, Any] = c.get("/readyz").json()
    return body if body["work_held_seconds"] > than else None
