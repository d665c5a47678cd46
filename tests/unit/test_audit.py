"""Audit chain: appends link up, verify catches edits and deletions, CLI verify/export.

Tests that take only ``store`` also run against PostgreSQL
(tests/integration/test_store_postgres.py).
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import exc as sa_exc

from radserve.audit import (
    GENESIS_HASH,
    Action,
    AuditEvent,
    AuditRecord,
    canonical_json,
    record_hash,
    verify_chain,
)
from radserve.commands.audit import group as audit_cli
from radserve.store import Store, init_store

T0 = dt.datetime(2025, 3, 1, 8, 0, tzinfo=dt.UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def fill(store: Store, n: int) -> None:
    for i in range(n):
        store.append_audit(AuditEvent(action="test.event", subject=f"s{i}", payload={"i": i}))


def raw(store: Store, sql: str) -> None:
    with store.engine.begin() as connection:
        connection.exec_driver_sql(sql)


def problems(store: Store) -> list[str]:
    return [str(p) for p in store.verify_audit().problems]


def test_records_link_to_their_predecessor(store: Store) -> None:
    first = store.append_audit(AuditEvent(action="config.loaded", payload={"fingerprint": "x"}))
    second = store.append_audit(
        AuditEvent(action="model.changed", subject="organs", actor_key_id="k1")
    )
    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == GENESIS_HASH and second.prev_hash == first.hash
    report = store.verify_audit()
    assert report.ok and report.records == 2
    assert (report.head_seq, report.head_hash) == (2, second.hash)
    assert list(store.iter_audit()) == [first, second]


def test_job_lifecycle_is_audited_without_patient_data(store: Store) -> None:
    job = store.create_job(
        priority_class="URGENT",
        deadline=dt.timedelta(0),
        pipeline_name="ct-chest-abdomen",
        pipeline_version="1.0",
        precision="fp16",
        fingerprint="f" * 64,
        study_path="studies/ff/x",
        model_versions={"organs": "1.2"},
        api_key_id="k1",
        client_address="10.1.2.3",
    )
    store.transition(job.id, "queued")
    store.transition(job.id, "running")
    store.record_result(job.id, "results/x", outputs={"findings": 2}, stage_timings={"all": 1.5})
    other = store.create_job(
        priority_class="OUTPATIENT",
        deadline=dt.timedelta(0),
        pipeline_name="ct-chest-abdomen",
        pipeline_version="1.0",
        precision="fp32",
        fingerprint="e" * 64,
        study_path="studies/ee/y",
    )
    store.transition(other.id, "cancelled", actor_key_id="admin1", client_address="10.9.9.9")
    records = list(store.iter_audit())
    assert [r.action for r in records] == [
        Action.JOB_SUBMITTED,
        Action.JOB_STARTED,
        Action.JOB_SUCCEEDED,
        Action.JOB_SUBMITTED,
        Action.JOB_CANCELLED,
    ]
    submitted, started, succeeded, _, cancelled = records
    assert started.subject == job.id and started.payload["attempts"] == 1
    assert submitted.subject == job.id
    assert (submitted.actor_key_id, submitted.client_address) == ("k1", "10.1.2.3")
    assert submitted.payload["fingerprint"] == "f" * 64
    assert submitted.payload["model_versions"] == {"organs": "1.2"}
    assert submitted.payload["precision"] == "fp16"
    assert succeeded.payload["outputs"] == {"findings": 2}
    assert succeeded.payload["timings"] == {"all": 1.5}
    assert (cancelled.actor_key_id, cancelled.client_address) == ("admin1", "10.9.9.9")
    assert "study_path" not in submitted.payload
    assert store.verify_audit().ok


def test_edited_record_is_named(store: Store) -> None:
    fill(store, 4)
    raw(store, """UPDATE audit_records SET payload = '{"i":99}' WHERE seq = 2""")
    assert problems(store) == ["seq 2: content does not match its hash (record was edited)"]


def test_edited_record_with_recomputed_hash_breaks_the_next_link(store: Store) -> None:
    fill(store, 4)
    raw(store, f"UPDATE audit_records SET action = 'x', hash = '{'1' * 64}' WHERE seq = 2")
    found = problems(store)
    assert found[0].startswith("seq 2: content does not match")
    assert found[1].startswith("seq 3: prev_hash does not match")


def test_unreadable_payload_is_reported(store: Store) -> None:
    fill(store, 2)
    raw(store, "UPDATE audit_records SET payload = 'not json' WHERE seq = 1")
    assert problems(store)[0].startswith("seq 1: record is unreadable")


def test_deleted_middle_record_is_detected(store: Store) -> None:
    fill(store, 5)
    raw(store, "DELETE FROM audit_records WHERE seq = 3")
    found = problems(store)
    assert "seq 4: record(s) 3 before it are missing (deleted)" in found
    assert any(p.startswith("seq 4: prev_hash") for p in found)


def test_deleted_newest_records_are_detected(store: Store) -> None:
    fill(store, 5)
    raw(store, "DELETE FROM audit_records WHERE seq >= 4")
    assert problems(store) == [
        "seq 5: chain head is at seq 5 but the last record is seq 3 "
        "(records deleted from the end, or the head was changed)"
    ]


def test_payload_must_be_json(store: Store) -> None:
    with pytest.raises(ValueError):
        store.append_audit(AuditEvent(action="x", payload={"v": float("nan")}))
    with pytest.raises(TypeError):
        store.append_audit(AuditEvent(action="x", payload={"v": object()}))
    assert store.verify_audit().ok and store.verify_audit().records == 0


def _closed(cursor: Any) -> bool:
    """psycopg's cursor says whether it is closed; sqlite3's refuses to fetch once it is."""
    if hasattr(cursor, "closed"):
        return bool(cursor.closed)
    try:
        cursor.fetchone()
    except sqlite3.ProgrammingError:
        return True
    return False


def _append_cursor(failure: pytest.ExceptionInfo[BaseException]) -> Any:
    """The driver cursor of the failed append, from its frame in the traceback."""
    return next(e.frame.f_locals["cursor"] for e in failure.traceback if e.name == "append_many")


def test_an_append_failing_half_way_closes_its_cursor_and_leaves_the_chain_whole(
    store: Store,
) -> None:
    fill(store, 2)
    # after the head is locked: a payload that is not JSON, then a constraint in the insert
    # (a stray row where the next record goes)
    with pytest.raises(ValueError) as not_json:
        store.append_audit(AuditEvent(action="x", payload={"v": float("nan")}))
    raw(
        store,
        "INSERT INTO audit_records (seq, ts, action, payload, prev_hash, hash) "
        "VALUES (3, '2025-03-01 08:00:00', 'stray', '{}', '-', 'stray')",
    )
    # the driver's error reaches the store as SQLAlchemy's, as from any other statement
    with pytest.raises(sa_exc.IntegrityError) as constraint:
        store.append_audit(AuditEvent(action="test.event", subject="s2"))
    assert isinstance(constraint.value.orig, store.engine.dialect.loaded_dbapi.IntegrityError)
    assert _closed(_append_cursor(not_json)) and _closed(_append_cursor(constraint))
    raw(store, "DELETE FROM audit_records WHERE seq = 3")
    third = store.append_audit(AuditEvent(action="test.event", subject="s2"))
    assert third.seq == 3 and third.prev_hash == list(store.iter_audit())[1].hash
    report = store.verify_audit()
    assert report.ok and report.records == 3


def test_concurrent_appends_from_two_stores_keep_one_chain(store: Store) -> None:
    # two engines on one database stand in for two processes (API and a worker)
    second = init_store(store.engine.url.render_as_string(hide_password=False))
    errors: list[BaseException] = []

    def append(target: Store, who: str) -> None:
        try:
            for i in range(8):
                target.append_audit(AuditEvent(action="test.event", subject=f"{who}{i}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=append, args=(s, f"{name}-"))
        for s, name in ((store, "a"), (store, "b"), (second, "c"), (second, "d"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    second.close()
    assert errors == []
    report = store.verify_audit()
    assert report.ok and report.records == 32
    assert [r.seq for r in store.iter_audit()] == list(range(1, 33))


# -- the chain itself, without a database --------------------------------------------------


def _chain(n: int) -> list[AuditRecord]:
    records, prev = [], GENESIS_HASH
    for seq in range(1, n + 1):
        fields = {
            "seq": seq,
            "ts": T0 + dt.timedelta(seconds=seq),
            "actor_key_id": None,
            "client_address": None,
            "action": "a",
            "subject": None,
            "payload": {"n": seq, "f": 0.1 * seq},
        }
        digest = record_hash(prev, **fields)  # type: ignore[arg-type]
        records.append(AuditRecord(prev_hash=prev, hash=digest, **fields))  # type: ignore[arg-type]
        prev = digest
    return records


def test_hash_is_sha256_of_prev_hash_and_canonical_json() -> None:
    import hashlib

    record = _chain(1)[0]
    body = {
        "seq": 1,
        "ts": record.ts.isoformat(),
        "actor_key_id": None,
        "client_address": None,
        "action": "a",
        "subject": None,
        "payload": {"n": 1, "f": 0.1},
    }
    expected = hashlib.sha256((GENESIS_HASH + canonical_json(body)).encode()).hexdigest()
    assert record.hash == expected
    assert canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'


def test_verify_chain_in_memory() -> None:
    chain = _chain(3)
    assert verify_chain(chain, head_seq=3, head_hash=chain[-1].hash).ok
    assert verify_chain([], head_seq=0, head_hash=GENESIS_HASH).ok
    reordered = [chain[0], chain[2], chain[1]]
    assert not verify_chain(reordered, head_seq=3, head_hash=chain[-1].hash).ok


# -- command line --------------------------------------------------------------------------


def test_cli_verify_and_export(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RADSERVE_DATABASE_URL", raising=False)
    monkeypatch.delenv("RADSERVE_CONFIG", raising=False)
    fill(store, 3)
    runner = CliRunner()
    ok = runner.invoke(audit_cli, ["verify", "--data-dir", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert "audit chain OK: 3 record(s)" in ok.output

    out = tmp_path / "export" / "audit.jsonl"
    exported = runner.invoke(audit_cli, ["export", "--out", str(out), "--data-dir", str(tmp_path)])
    assert exported.exit_code == 0, exported.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seq"] for r in lines] == [1, 2, 3]
    assert lines[1]["prev_hash"] == lines[0]["hash"] and lines[2]["payload"] == {"i": 2}

    raw(store, """UPDATE audit_records SET payload = '{"i":7}' WHERE seq = 2""")
    broken = runner.invoke(audit_cli, ["verify", "--data-dir", str(tmp_path)])
    assert broken.exit_code == 1
    assert "seq 2: content does not match its hash" in broken.output
