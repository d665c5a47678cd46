"""Store schema: migrations build exactly the ORM tables; SQLite runs durable and locked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from radserve.store import Store, StoreError, init_store
from radserve.store.db import normalise_url
from radserve.store.migrate import current_revision, head_revision
from radserve.store.models import Base


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def test_migrations_match_the_models(store: Store) -> None:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_schema_is_at_head_and_init_is_idempotent(store: Store, tmp_path: Path) -> None:
    assert current_revision(store.engine) == head_revision()
    again = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        assert current_revision(again.engine) == head_revision()
    finally:
        again.close()


def test_sqlite_runs_wal_full_sync_with_foreign_keys(store: Store) -> None:
    with store.engine.connect() as connection:
        pragma = {
            name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }
    assert pragma == {
        "journal_mode": "wal",
        "synchronous": 2,
        "foreign_keys": 1,
        "busy_timeout": 30000,
    }


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(Exception, match="FOREIGN KEY"), store.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO results_cache (fingerprint, pipeline_name, pipeline_version, "
                "model_versions_key, precision, job_id, created) "
                "VALUES ('f', 'p', '1', '{}', 'fp32', 'missing', '2025-01-01 00:00:00')"
            )
        )


def test_init_creates_the_folder_of_a_sqlite_file(tmp_path: Path) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'new' / 'dir' / 'radserve.db'}")
    store.close()
    assert (tmp_path / "new" / "dir" / "radserve.db").is_file()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("sqlite://", "needs a SQLite database file"),
        ("sqlite:///:memory:", "needs a SQLite database file"),
        ("mysql://u@h/db", "unsupported database 'mysql'"),
    ],
)
def test_unsupported_urls_are_refused(url: str, match: str) -> None:
    with pytest.raises(StoreError, match=match):
        init_store(url)


def test_plain_postgresql_url_means_psycopg3() -> None:
    url = normalise_url("postgresql://u:secret@db.example/radserve")
    assert url.drivername == "postgresql+psycopg"


def test_unreachable_database_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot open the database"):
        init_store("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
