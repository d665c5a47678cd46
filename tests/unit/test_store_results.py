"""The result index (WADO-RS reads it) and the outbox kind migration over existing rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from tests.factories.postgres import postgres_schema

from radserve.store import Store, init_store
from radserve.store.db import normalise_url
from radserve.store.migrate import head_revision, upgrade
from radserve.store.outbox import OutboxKind, OutboxStore
from radserve.store.results import ResultIndex, ResultInstanceRecord

NOW = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)


def _record(sop: str, series: str = "1.2.3.1", study: str = "1.2.3") -> ResultInstanceRecord:
    return ResultInstanceRecord(
        sop_instance_uid=sop,
        study_instance_uid=study,
        series_instance_uid=series,
        sop_class_uid="1.2.840.10008.5.1.4.1.1.66.4",
        transfer_syntax_uid="1.2.840.10008.1.2.1",
        job_id="job-1",
        path=f"/results/job-1/{sop}.dcm",
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        yield init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
        return
    with postgres_schema("radserve_results") as url:
        opened = init_store(url)
        yield opened
        opened.close()


def test_index_finds_by_study_series_and_instance_and_adds_once(store: Store) -> None:
    try:
        index = ResultIndex(store.engine)
        records = [_record("1.2.3.1.1"), _record("1.2.3.1.2"), _record("1.2.3.2.1", "1.2.3.2")]
        assert index.add(records, now=NOW) == 3
        assert index.add(records[:1], now=NOW) == 0  # idempotent
        assert [r.sop_instance_uid for r in index.find("1.2.3")] == [
            "1.2.3.1.1",
            "1.2.3.1.2",
            "1.2.3.2.1",
        ]
        assert [r.sop_instance_uid for r in index.find("1.2.3", "1.2.3.2")] == ["1.2.3.2.1"]
        assert index.find("1.2.3", "1.2.3.1", "1.2.3.1.2") == [records[1]]
        assert index.find("9.9") == [] and index.find("1.2.3", "1.2.3.1", "1.2.3.2.1") == []
        assert len(index.of_job("job-1")) == 3
    finally:
        store.close()


def test_existing_outbox_rows_become_dicom_deliveries(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'radserve.db'}"
    engine = create_engine(normalise_url(url))
    upgrade(engine, "0002_outbox")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO outbox_deliveries (destination, path, sop_class_uid, "
                "sop_instance_uid, study_instance_uid, transfer_syntax_uid, state, attempts, "
                "next_attempt_at, created, updated) VALUES ('PACS', '/x.dcm', '1.2', '1.2.3', "
                "'1.2', '1.2.840.10008.1.2.1', 'pending', 0, :t, :t, :t)"
            ),
            {"t": NOW},
        )
    engine.dispose()
    store = init_store(url)
    try:
        with store.engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version"))
            assert version.scalar() == head_revision()
        (row,) = OutboxStore(store.engine).items()
        assert row.kind is OutboxKind.DICOM and row.sop_instance_uid == "1.2.3"
    finally:
        store.close()
