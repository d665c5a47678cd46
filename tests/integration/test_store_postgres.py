"""The store suites (jobs, audit, keys) against a real PostgreSQL server.

Runs when ``RADSERVE_TEST_DATABASE_URL`` is set (``.ci/run`` sets it), else skips. Each
test run migrates a schema of its own (``radserve_test_<random>``, dropped at the end),
so parallel runs on one server do not collide; tables are emptied between tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.engine import make_url
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.unit import (
    test_audit,
    test_audit_batch,
    test_key_verifier,
    test_keys,
    test_lease_keeper,
    test_store_jobs,
    test_store_leases,
)

from radserve.audit.chain import GENESIS_HASH
from radserve.store import JobState, Store, init_store
from radserve.store.migrate import current_revision, head_revision
from radserve.store.models import Base

pytestmark = requires_postgres

# The same tests as on SQLite: every test of these modules that needs only `store`.
for _suite in (
    test_store_jobs,
    test_audit,
    test_audit_batch,
    test_key_verifier,
    test_keys,
    test_store_leases,
    test_lease_keeper,
):
    for _name, _test in vars(_suite).items():
        if _name.startswith("test_") and callable(_test):
            _args = _test.__code__.co_varnames[: _test.__code__.co_argcount]
            if "store" in _args and set(_args) <= {"store", "path", "target", "role", "allowed"}:
                globals()[f"{_name}__{_suite.__name__.rsplit('.', 1)[-1]}"] = _test
del _suite, _name, _test, _args


@pytest.fixture(scope="module")
def schema_url() -> Iterator[str]:
    with postgres_schema("radserve_test") as url:
        yield url


@pytest.fixture(scope="module")
def migrated(schema_url: str) -> Iterator[Store]:
    store = init_store(schema_url)
    yield store
    store.close()


@pytest.fixture
def store(migrated: Store) -> Store:
    with migrated.engine.begin() as connection:
        connection.execute(text("TRUNCATE results_cache, jobs, api_keys, audit_records"))
        connection.execute(text("UPDATE audit_head SET seq = 0, hash = :h"), {"h": GENESIS_HASH})
    return migrated


def test_schema_lives_in_its_own_schema(store: Store, schema_url: str) -> None:
    assert store.dialect == "postgresql"
    assert current_revision(store.engine) == head_revision()
    schema = make_url(schema_url).query["options"].split("=", 1)[1]
    with store.engine.connect() as connection:
        tables = set(
            connection.execute(
                text("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema},
            ).scalars()
        )
    assert {"jobs", "results_cache", "api_keys", "audit_records", "audit_head"} <= tables


def test_migrations_match_the_models(store: Store) -> None:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_init_store_twice_concurrently_migrates_once(schema_url: str) -> None:
    errors: list[BaseException] = []

    def open_close() -> None:
        try:
            init_store(schema_url).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_close) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_claims_from_two_processes_have_one_winner(store: Store) -> None:
    second = init_store(store.engine.url.render_as_string(hide_password=False))
    job = test_store_jobs.walk(store, test_store_jobs.new_job(store).id, "queued")
    outcomes: list[Any] = []
    barrier = threading.Barrier(2)

    def claim(target: Store) -> None:
        barrier.wait()
        try:
            outcomes.append(target.transition(job.id, "running").state)
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=claim, args=(s,)) for s in (store, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    second.close()
    assert sorted(map(str, outcomes)) == ["InvalidTransitionError", JobState.RUNNING.value]
