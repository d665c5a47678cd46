"""PostgreSQL that answers but cannot serve radserve in time: a table locked by another
session (an operator's maintenance, a stuck transaction) and a connection pool every
connection of which is in use. Both are outages to radserve's callers (503 with
``Retry-After``, the loops try again), never a hang nor a 500.

Before (a probe: ``LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE`` held 150 s in psql under
200 concurrent API requests to a real server): every statement on ``jobs`` waited for the
lock while holding a pooled connection and an API thread; those requests were answered
504 ``request_timeout`` (not retryable) after 60 s, and the others, finding the pool
empty for 30 s, 500 ``internal_error`` with SQLAlchemy's ``QueuePool limit ... reached``
traceback in the log, ``/readyz`` among them."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from tests.factories.postgres import postgres_schema
from tests.factories.service import ServerThread, auth, create_key, settings_for

from radserve.api import create_app
from radserve.domain.priority import PriorityClass
from radserve.service import Service
from radserve.store import Store, init_store
from radserve.store import db as store_db
from radserve.store.db import normalise_url
from radserve.store.errors import DatabaseUnavailableError

# a bound for calls that must end on their own (the old code waited for the lock)
ENDS_WITHIN_S = 60.0


@pytest.fixture
def quick_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rules with shorter waits (read when an engine and its connections are
    made), so the test takes seconds."""
    monkeypatch.setattr(store_db, "PG_LOCK_TIMEOUT_MS", 500, raising=False)
    monkeypatch.setattr(store_db, "POOL_TIMEOUT_S", 1.0, raising=False)


@pytest.fixture
def url() -> Iterator[str]:
    with postgres_schema("radserve_busy") as url:
        yield url


@contextmanager
def jobs_locked(url: str) -> Iterator[None]:
    """``jobs`` locked ACCESS EXCLUSIVE by another session until the block ends."""
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as connection:
            connection.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
            yield
            connection.rollback()
    finally:
        engine.dispose()


def _new_job(store: Store) -> str:
    return store.create_job(
        priority_class=PriorityClass.OUTPATIENT,
        deadline=dt.timedelta(hours=1),
        pipeline_name="p",
        pipeline_version="1",
        precision="fp32",
        fingerprint="f" * 64,
        study_path="/nowhere",
    ).id


def _ends(call: object) -> BaseException | None:
    """Run ``call`` on a thread; what it raised (None: it returned), failing the test if
    it is still running after :data:`ENDS_WITHIN_S`."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(ENDS_WITHIN_S)
    assert not thread.is_alive(), f"still waiting after {ENDS_WITHIN_S:.0f} s"
    return outcome[0]


@pytest.mark.usefixtures("quick_timeouts")
def test_a_statement_waiting_on_a_lock_fails_as_an_outage(url: str) -> None:
    store = init_store(url)
    try:
        job_id = _new_job(store)
        with jobs_locked(url):
            raised = _ends(lambda: store.get_job(job_id))
        assert isinstance(raised, DatabaseUnavailableError), raised
        assert raised.retryable and raised.outage
        assert "lock_timeout" in raised.message
        assert store.get_job(job_id).id == job_id  # the lock gone: it reads again
    finally:
        store.close()


def test_a_lock_timeout_the_database_sets_is_kept(url: str) -> None:
    engine = store_db.make_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SHOW lock_timeout")).scalar() == "10s"
            connection.execute(text("SET lock_timeout = '3s'"))
            connection.commit()
    finally:
        engine.dispose()
    own = normalise_url(url)
    options = f"{own.query.get('options', '')} -clock_timeout=3s".strip()
    engine = store_db.make_engine(own.update_query_dict({"options": options}))
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SHOW lock_timeout")).scalar() == "3s"
    finally:
        engine.dispose()


@pytest.mark.usefixtures("quick_timeouts")
def test_no_free_pooled_connection_is_an_outage_not_an_internal_error(url: str) -> None:
    store = init_store(url)
    try:
        job_id = _new_job(store)
        with ExitStack() as held:  # every connection the pool has, checked out
            pool = store.engine.pool
            for _ in range(pool.size() + store.engine.pool._max_overflow):  # type: ignore[attr-defined]
                held.enter_context(store.engine.connect())
            raised = _ends(lambda: store.get_job(job_id))
            assert isinstance(raised, DatabaseUnavailableError), raised
            assert "in use" in raised.message
            assert _ends(lambda: store.ping()) is None
            assert store.ping() is False
        assert store.get_job(job_id).id == job_id
        assert store.ping() is True
    finally:
        store.close()


@pytest.mark.usefixtures("quick_timeouts")
def test_concurrent_requests_during_a_table_lock_get_503_with_retry_after(
    tmp_path: Path, url: str
) -> None:
    service = Service(settings_for(tmp_path, database_url=url, server__store_wait_s=1.0))
    key = create_key(service.store, "admin")
    job_id = _new_job(service.store)
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
        assert c.get(f"/v1/jobs/{job_id}", headers=auth(key)).status_code == 200
        with jobs_locked(url), ThreadPoolExecutor(60) as pool:
            answers = list(
                pool.map(
                    lambda i: httpx.get(
                        f"{srv.url}{'/v1/jobs?limit=5' if i % 2 else '/readyz'}",
                        headers=auth(key),
                        timeout=ENDS_WITHIN_S,
                    ),
                    range(120),
                )
            )
        jobs = [a for a in answers if a.url.path == "/v1/jobs"]
        assert {a.status_code for a in jobs} == {503}, {a.status_code for a in jobs}
        for answer in jobs:
            assert answer.headers["Retry-After"]
            assert answer.json()["error"]["code"] == "store_error", answer.text
        # /readyz reads no job: it answers, ready or not, never an error of its own
        assert {a.status_code for a in answers if a.url.path == "/readyz"} <= {200, 503}
        listed = c.get("/v1/jobs?limit=5", headers=auth(key))
        assert listed.status_code == 200, listed.text
