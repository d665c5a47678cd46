"""Throw-away schemas on the test PostgreSQL server (``RADSERVE_TEST_DATABASE_URL``).

Each user gets a schema of its own (``<prefix>_<random>``, reached through the
connection's ``search_path`` and dropped at the end), so parallel runs on one server do
not collide.

Example::

    @pytest.fixture(scope="module")
    def database_url() -> Iterator[str]:
        with postgres_schema("radserve_x") as url:
            yield url
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from radserve.store import Store, init_store
from radserve.store.db import normalise_url

TEST_DATABASE_URL = os.environ.get("RADSERVE_TEST_DATABASE_URL")
requires_postgres = pytest.mark.skipif(
    not TEST_DATABASE_URL, reason="RADSERVE_TEST_DATABASE_URL is not set"
)


@contextmanager
def postgres_schema(prefix: str) -> Iterator[str]:
    """A new schema ``<prefix>_<12 hex>`` on the test server; yields a URL whose connections
    use it as ``search_path``; drops it, with everything in it, at the end. Skips the test
    when no server is configured."""
    if not TEST_DATABASE_URL:
        pytest.skip("RADSERVE_TEST_DATABASE_URL is not set")
    base_url = TEST_DATABASE_URL
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(normalise_url(base_url))
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = normalise_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def store_on(kind: str, folder: Path, prefix: str) -> Iterator[Store]:
    """A migrated store on ``kind`` (``sqlite``: a file in ``folder``; ``postgresql``: a
    throw-away schema ``<prefix>_…``, skipped without a server), closed at the end: the
    body of a fixture parametrised over both databases."""
    if kind == "sqlite":
        store = init_store(f"sqlite:///{folder / 'radserve.db'}")
        try:
            yield store
        finally:
            store.close()
        return
    with postgres_schema(prefix) as url:
        store = init_store(url)
        try:
            yield store
        finally:
            store.close()
