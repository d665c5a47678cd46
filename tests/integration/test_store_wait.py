"""A submission that meets a database outage (``server.store_wait_s``), on a real
PostgreSQL server that the test stops and starts, and a real server on a port:

- within the wait: the submission (its study already stored) waits for the database
  and is answered 202 once its job row commits, and the job runs;
- past the wait: 503 with ``Retry-After``, and no job row is left behind;
- once the database is back the very next submission is accepted: no stale pooled
  connection or open circuit keeps refusing.

At host load 11-12, 5 of 8 submissions were refused during two 2.5 s restarts, each
while the server was down or starting (tests/e2e/test_postgres_restart.py).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.service import Service
from radserve.store.db import normalise_url

WAIT_S = 120.0


def _job_count(url: str) -> int:
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as connection:
            return int(connection.execute(text("SELECT count(*) FROM jobs")).scalar_one())
    finally:
        engine.dispose()


def _service(tmp_path: Path, url: str, wait_s: float) -> Service:
    return Service(settings_for(tmp_path, database_url=url, server__store_wait_s=wait_s))


def test_a_submission_waits_out_a_short_outage_and_is_refused_past_the_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="radserve.store.waiting")
    with PrivatePostgres() as pg:
        # within the wait: the outage ends while the submission waits
        service = _service(tmp_path, pg.url, WAIT_S)
        key = create_key(service.store, "admin")
        with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
            assert service.wait_warm(120 * WAIT_SCALE)
            first = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "a")), headers=auth(key)
            )
            assert first.status_code == 202, first.text
            assert wait_job(c, first.json()["id"], key, timeout=WAIT_S)["state"] == "succeeded"

            pg.shut_down()
            answers: list[httpx.Response] = []
            study = make_study(tmp_path / "b")

            def submit() -> None:
                answers.append(
                    c.post("/v1/studies", files=upload(study), headers=auth(key), timeout=None)
                )

            waiting = threading.Thread(target=submit, daemon=True)
            waiting.start()
            until(
                lambda: any("waiting up to" in r.getMessage() for r in caplog.records),
                "the submission to wait for the database",
                WAIT_S,
            )
            assert waiting.is_alive() and not answers, "answered before the database was back"
            pg.start_again()
            waiting.join(WAIT_S * WAIT_SCALE)
            assert len(answers) == 1 and answers[0].status_code == 202, answers
            job = answers[0].json()["id"]
            assert wait_job(c, job, key, timeout=WAIT_S)["state"] == "succeeded"
        assert _job_count(pg.url) == 2

        # past the wait: refused with Retry-After, nothing stored in the database
        service = _service(tmp_path, pg.url, 1.0)
        with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
            assert service.wait_warm(120 * WAIT_SCALE)
            # a submission first: the key is remembered, the pool holds connections
            taken = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "c0")), headers=auth(key)
            )
            assert taken.status_code == 202, taken.text
            assert wait_job(c, taken.json()["id"], key, timeout=WAIT_S)["state"] == "succeeded"
            pg.shut_down()
            refused = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "c")), headers=auth(key)
            )
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "1"
            error: dict[str, Any] = refused.json()["error"]
            assert error["code"] == "store_error" and error["retryable"], error
            assert "server.store_wait_s" in error["message"], error
            pg.start_again()
            # the very next submission after the restart is taken (pooled connections
            # cut by the restart are replaced, nothing stays open)
            again = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "d")), headers=auth(key)
            )
            assert again.status_code == 202, again.text
            assert wait_job(c, again.json()["id"], key, timeout=WAIT_S)["state"] == "succeeded"
        assert _job_count(pg.url) == 4
