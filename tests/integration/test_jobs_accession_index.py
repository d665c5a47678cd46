"""Revision 0021's index on the job row's accession number, which ``GET /v1/jobs?
accession=`` (an exact match) is served by.

On PostgreSQL the index is a hash: the number is kept whole, as the header has it, and a
B-tree entry over about 2,700 bytes fails the insert, so a non-conformant sender's
10,000-character number would have failed its job's creation. The planner uses the index
for the exact match among many jobs (before: the list walked the arrival index through
every older job), and the revision goes down and up again with the rows kept.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, text
from tests.factories.postgres import postgres_schema

from radserve.store import Store, init_store
from radserve.store.db import normalise_url, writer
from radserve.store.jobs import list_jobs, list_query
from radserve.store.migrate import alembic_config, current_revision, head_revision, upgrade
from radserve.store.models import Job

BEFORE = "0020_job_accession"
NOW = dt.datetime(2026, 12, 7, 8, 0, tzinfo=dt.UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'radserve.db'}"
        return
    with postgres_schema("radserve_acc_index") as url:
        yield url


def _job(store: Store, accession: str, minutes: int) -> str:
    return store.create_job(
        priority_class="OUTPATIENT",
        deadline=dt.timedelta(hours=1),
        pipeline_name="ct",
        pipeline_version="1",
        precision="fp32",
        fingerprint=f"{minutes:064x}",
        study_path=f"/studies/{minutes}",
        arrival=NOW + dt.timedelta(minutes=minutes),
        accession=accession,
    ).id


def test_a_whole_long_number_is_stored_and_found(database_url: str) -> None:
    """A 10,000-character number (a non-conformant sender's) makes its job and is found
    by its exact value; on PostgreSQL a B-tree index would refuse the insert."""
    store = init_store(database_url)
    try:
        # random characters: PostgreSQL compresses a repeated run below the B-tree limit
        letters = random.Random(7).choices(string.ascii_letters + string.digits, k=10_000)
        long_number = "".join(letters)
        wanted = _job(store, long_number, 1)
        _job(store, long_number[:-1], 2)
        page = list_jobs(store, accession_is=long_number, limit=10)
        assert [job.id for job in page.items] == [wanted]
    finally:
        store.close()


def test_the_exact_match_is_served_by_the_index_among_many_jobs() -> None:
    """20,000 jobs, two with the number asked for: PostgreSQL's plan for the list's own
    query reads ``ix_jobs_accession`` (before revision 0021 it walked the arrival
    index)."""
    with postgres_schema("radserve_acc_plan") as url:
        store = init_store(url)
        try:
            _job(store, "SEED", 0)
            with store.engine.begin() as connection:
                # copies of the seed row, each its own id, fingerprint and number
                copied = {
                    "id": "'copy-' || n",
                    "arrival": "arrival + n * interval '1 second'",
                    "fingerprint": "lpad(to_hex(n), 64, '0')",
                    "accession": "CASE WHEN n IN (7000, 13000) THEN 'RARE-1' ELSE 'ACC-' || n END",
                }
                columns = [column.name for column in Job.__table__.columns]
                connection.execute(
                    text(
                        f"INSERT INTO jobs ({', '.join(columns)}) SELECT "
                        + ", ".join(copied.get(name, name) for name in columns)
                        + " FROM jobs, generate_series(1, 20000) AS n WHERE id = :seed"
                    ),
                    {"seed": list_jobs(store, limit=1).items[0].id},
                )
                connection.execute(text("ANALYZE jobs"))
            query = list_query(
                state=None,
                priority_class=None,
                pipeline=None,
                created_after=None,
                created_before=None,
                cursor=None,
                limit=50,
                accession_is="RARE-1",
            )
            compiled = query.compile(store.engine, compile_kwargs={"literal_binds": True})
            with store.engine.connect() as connection:
                plan = connection.execute(text(f"EXPLAIN (FORMAT JSON) {compiled}")).scalar()
            plan_text = json.dumps(plan)
            assert "ix_jobs_accession" in plan_text, plan_text
            found = list_jobs(store, accession_is="RARE-1", limit=50).items
            assert sorted(job.id for job in found) == ["copy-13000", "copy-7000"]
        finally:
            store.close()


def _downgrade(engine: Engine, revision: str) -> None:
    with writer(engine).begin() as connection:
        command.downgrade(alembic_config(connection), revision)


def _indexes(engine: Engine) -> set[str]:
    from sqlalchemy import inspect

    return {index["name"] for index in inspect(engine).get_indexes("jobs")}


def test_the_revision_goes_down_and_up_with_the_rows(database_url: str) -> None:
    engine = create_engine(normalise_url(database_url))
    try:
        upgrade(engine, BEFORE)
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO jobs (id, state, priority_class, arrival, deadline, updated, "
                    "pipeline_name, pipeline_version, precision, model_versions, fingerprint, "
                    "study_path, attempts, stage_timings, queue_meta, accession) VALUES "
                    "('old-1', 'queued', 'OUTPATIENT', :t, :t, :t, 'ct', '1', 'fp32', '{}', "
                    "'f', '/s', 0, '{}', '{}', 'ACC-1')"
                ),
                {"t": NOW},
            )
        assert "ix_jobs_accession" not in _indexes(engine)
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert "ix_jobs_accession" in _indexes(engine)
        _downgrade(engine, BEFORE)
        assert "ix_jobs_accession" not in _indexes(engine)
        upgrade(engine)
        assert "ix_jobs_accession" in _indexes(engine)
        with engine.connect() as connection:
            number = connection.execute(
                text("SELECT accession FROM jobs WHERE accession = 'ACC-1'")
            ).scalar()
        assert number == "ACC-1"
    finally:
        engine.dispose()
