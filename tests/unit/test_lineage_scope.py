"""Result lineage per scope (migration 0019): under ``security.visibility`` a study's
generations are counted per group of submitters who see each other's jobs, so a site's
run of a study another site ran starts that site's own lineage. The migration adds the
scope to existing rows as ``''`` (the lineage without a rule) and goes back without
losing a row. On SQLite and PostgreSQL (skipped without ``RADSERVE_TEST_DATABASE_URL``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import IntegrityError
from tests.factories.postgres import postgres_schema, store_on

from radserve.security.access import ReadAccess, Scope
from radserve.store import Store, init_store
from radserve.store.db import normalise_url, writer
from radserve.store.migrate import alembic_config, current_revision, head_revision, upgrade
from radserve.store.models import Base
from radserve.store.results import LineageIndex

NOW = dt.datetime(2026, 12, 6, 12, tzinfo=dt.UTC)
BEFORE = "0018_deployment_undeploy"
DATABASES = ["sqlite", "postgresql"]


@pytest.fixture(params=DATABASES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_lineage") as opened:
        yield opened


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'radserve.db'}"
        return
    with postgres_schema("radserve_lineage_mig") as url:
        yield url


def _downgrade(engine: Engine, revision: str) -> None:
    with writer(engine).begin() as connection:
        command.downgrade(alembic_config(connection), revision)


def _rows(engine: Engine) -> dict[str, tuple[str, ...]]:
    with engine.connect() as connection:
        columns = "job_id, study_instance_uid, generation"
        if current_revision(engine) == head_revision():
            columns += ", scope"
        rows = connection.execute(text(f"SELECT {columns} FROM result_lineage")).all()
    return {row[0]: tuple(str(v) for v in row[1:]) for row in rows}


def test_generations_are_counted_per_scope(store: Store) -> None:
    index = LineageIndex(store.engine)
    a1 = index.claim("a1", "1.2.3", "ct", now=NOW, scope="site:A")
    b1 = index.claim("b1", "1.2.3", "ct", now=NOW, scope="site:B")
    b2 = index.claim("b2", "1.2.3", "ct", now=NOW, scope="site:B")
    open1 = index.claim("g1", "1.2.3", "ct", now=NOW)
    assert [r.generation for r in (a1, b1, b2, open1)] == [1, 1, 2, 1]
    assert index.earlier(b2) == [b1]  # never site A's
    assert index.earlier(b1) == [] and index.earlier(a1) == []
    # a job resumed after a crash keeps the generation and scope it claimed
    assert index.claim("b1", "1.2.3", "ct", now=NOW, scope="site:A") == b1
    assert b1.scope == "site:B" and open1.scope == ""


def test_scope_migration_keeps_rows_and_goes_back(database_url: str) -> None:
    engine = create_engine(normalise_url(database_url))
    try:
        upgrade(engine, BEFORE)
        with engine.begin() as connection:
            for job, generation in (("old-1", 1), ("old-2", 2)):
                connection.execute(
                    text(
                        "INSERT INTO result_lineage (job_id, study_instance_uid, "
                        "pipeline_name, generation, created) VALUES (:j, '1.2.3', 'ct', :g, :t)"
                    ),
                    {"j": job, "g": generation, "t": NOW},
                )
        upgrade(engine)
        assert _rows(engine) == {"old-1": ("1.2.3", "1", ""), "old-2": ("1.2.3", "2", "")}
        index = LineageIndex(engine)
        # the rows before the migration are the lineage without a rule; a site's is new
        assert index.claim("open-3", "1.2.3", "ct", now=NOW).generation == 3
        assert index.claim("b-1", "1.2.3", "ct", now=NOW, scope="site:B").generation == 1
        assert index.claim("b-2", "1.2.3", "ct", now=NOW, scope="site:B").generation == 2

        _downgrade(engine, BEFORE)
        assert current_revision(engine) == BEFORE
        # one lineage per study again: the site's rows follow the unscoped ones
        assert _rows(engine) == {
            "old-1": ("1.2.3", "1"),
            "old-2": ("1.2.3", "2"),
            "open-3": ("1.2.3", "3"),
            "b-1": ("1.2.3", "4"),
            "b-2": ("1.2.3", "5"),
        }
        # the old constraint is back
        with pytest.raises(IntegrityError, match=r"(?i)unique"), engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO result_lineage (job_id, study_instance_uid, "
                    "pipeline_name, generation, created) VALUES ('x', '1.2.3', 'ct', 5, :t)"
                ),
                {"t": NOW},
            )

        upgrade(engine)
        assert set(_rows(engine).values()) >= {("1.2.3", "5", "")}
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()
    init_store(database_url).close()  # the store opens the round-tripped schema


@pytest.mark.parametrize(
    ("visibility", "expected"),
    [
        ("all", {"a": "", "a2": "", "b": "", "loner": "", None: ""}),
        (
            "site",
            {"a": "site:A", "a2": "site:A", "b": "site:B", "loner": "actor:", None: ""},
        ),
        (
            "own_submitter",
            {"a": "submitter:ra", "a2": "actor:", "b": "submitter:ra", "loner": "actor:"},
        ),
    ],
)
def test_the_group_of_a_submitter_is_whom_its_jobs_are_visible_with(
    tmp_path: Path, visibility: str, expected: dict[str | None, str]
) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        ids: dict[str | None, str | None] = {None: None}
        for name, site, submitter in (
            ("a", "A", "ra"),
            ("a2", "A", None),
            ("b", "B", "ra"),
            ("loner", None, None),
        ):
            record, _ = store.create_api_key(
                name=name, role="submit", site=site, submitter=submitter
            )
            ids[name] = record.id
        access = ReadAccess(store, visibility, local_scopes=lambda: {"user:u": Scope("A")})  # type: ignore[arg-type]
        for name, group in expected.items():
            actor = ids[name]
            assert access.group_of(actor) == (group + actor if group == "actor:" else group)
        if visibility == "site":  # a console user of site A shares site A's lineage
            assert access.group_of("user:u") == "site:A"
    finally:
        store.close()
