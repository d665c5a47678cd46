"""A frozen PostgreSQL host whose kernel still acknowledges TCP (a private server stopped
with SIGSTOP, every process of it: the postmaster and its backends): radserve's API
answers 503 with ``Retry-After`` (the database is out), not 504 ``request_timeout``
after ``server.request_timeout_s``, and works again once the server is thawed.

Neither TCP keepalives nor ``tcp_user_timeout`` notice such a host (its kernel answers
the probes and acknowledges every byte), and ``statement_timeout`` / ``lock_timeout`` are
enforced by the frozen server; only a deadline on the client's side bounds the wait
(:data:`radserve.store.db.PG_STATEMENT_DEADLINE_S`)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from tests.factories.private_postgres import PrivatePostgres, postgres_bin
from tests.factories.service import ServerThread, auth, create_key, settings_for
from tests.factories.waits import until

from radserve.api import create_app
from radserve.service import Service
from radserve.store import db as store_db

pytestmark = pytest.mark.skipif(postgres_bin() is None, reason="no PostgreSQL binaries")


def _server_pids(pg: PrivatePostgres) -> list[int]:
    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(
        ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
    ).stdout.split()
    return [postmaster, *map(int, children)]


@contextmanager
def frozen(pg: PrivatePostgres) -> Iterator[None]:
    pids = _server_pids(pg)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule with a shorter wait (read when an engine is made): seconds, not 30."""
    monkeypatch.setattr(store_db, "PG_STATEMENT_DEADLINE_S", 3.0, raising=False)
    monkeypatch.setattr(store_db, "POOL_TIMEOUT_S", 2.0, raising=False)
    monkeypatch.setattr(
        store_db, "PG_CLIENT_OPTIONS", store_db.PG_CLIENT_OPTIONS | {"connect_timeout": 3}
    )


@pytest.mark.usefixtures("short_deadline")
def test_a_frozen_database_host_is_a_503_with_retry_after_not_a_504(tmp_path: Path) -> None:
    with PrivatePostgres() as pg:
        settings = settings_for(
            tmp_path,
            database_url=pg.url,
            server__request_timeout_s=30.0,  # the old answer: 504 after this
        )
        service = Service(settings)
        key = create_key(service.store, "read")
        try:
            with (
                ServerThread(create_app(service, key_ttl_s=3600)) as srv,
                httpx.Client(base_url=srv.url, headers=auth(key), timeout=120) as c,
            ):
                until(lambda: c.get("/v1/jobs").status_code == 200, "the store answers", 120)
                with frozen(pg):
                    answers = [c.get("/v1/jobs") for _ in range(3)]
                    for answer in answers:
                        assert answer.status_code == 503, (answer.status_code, answer.text)
                        assert answer.headers.get("retry-after"), answer.headers
                        assert answer.json()["error"]["retryable"] is True, answer.text
                until(lambda: c.get("/v1/jobs").status_code == 200, "the store again", 120)
        finally:
            service.stop()
