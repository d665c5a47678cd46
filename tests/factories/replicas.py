"""Two ``radserve serve`` replicas on one database: a fresh database, their settings."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from radserve.store.db import normalise_url
from tests.factories.service import config_file, make_models_slow

TEST_DATABASE_URL = os.environ.get("RADSERVE_TEST_DATABASE_URL")


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new database ``radserve_t_<hex>`` on the test server, dropped afterwards
    (skips without ``RADSERVE_TEST_DATABASE_URL``)."""
    if not TEST_DATABASE_URL:
        pytest.skip("RADSERVE_TEST_DATABASE_URL is not set")
    import psycopg

    base = make_url(normalise_url(TEST_DATABASE_URL))
    name = f"radserve_t_{uuid.uuid4().hex[:12]}"
    conninfo = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rows_of(engine: Engine) -> Callable[[str], list[Any]]:
    """``rows(sql)``: every row a query returns on ``engine`` (a connection each time)."""

    def rows(query: str) -> list[Any]:
        with engine.connect() as connection:
            return list(connection.execute(text(query)).all())

    return rows


def replica_config(
    root: Path,
    name: str,
    url: str,
    fhir_url: str | None,
    *,
    job_lease_s: float,
    outbox_lease_s: float,
    slow: bool = True,
    **sections: Any,
) -> Path:
    """Settings of replica ``name`` (its own folder and, with ``slow``, slow models; the
    shared database ``url``; FHIR delivery to ``fhir_url``; more ``sections``)."""
    folder = root / name
    folder.mkdir()
    outbox = {"replicas": 2, "instance_id": f"replica-{name}", "lease_s": outbox_lease_s}
    fhir = {"fhir": {"url": fhir_url, "timeout_s": 30}} if fhir_url else {}
    config = config_file(
        folder,
        database_url=url,
        jobs={"lease_s": job_lease_s, "lease_poll_s": 0.5},
        outbox={**outbox, **sections.pop("outbox", {})},
        **fhir,
        **sections,
    )
    if slow:
        make_models_slow(folder / "assets" / "models", layers=4, channels=32)
    return config
