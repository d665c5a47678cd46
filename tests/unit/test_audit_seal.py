"""The audit chain against a writer of its database: keyed hashes (HMAC with a key kept
outside the database) and signed checkpoints outside it. Each of the four attacks that
used to verify as OK — a forged row with a valid hash, the tail cut and the head moved
back, an edit rehashed through the end, every record wiped — now fails verification,
through the API and through ``radserve audit verify``."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.audit import AuditEvent, canonical_json, record_hash
from radserve.audit.chain import GENESIS_HASH, AuditKey
from radserve.audit.seal import (
    AuditKeyError,
    CheckpointFile,
    ExpectedHead,
    checkpoint_path,
    key_file_path,
    load_key,
    verify_sealed,
)
from radserve.audit.trail import AuditTrail
from radserve.commands.audit import group as audit_cli
from radserve.config import Settings, load_settings
from radserve.store import Store, init_store
from radserve.store.audit import AuditKeyMissingError
from radserve.store.audited import open_audited


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("RADSERVE_DATABASE_URL", "RADSERVE_CONFIG", "RADSERVE_AUDIT__KEY"):
        monkeypatch.delenv(name, raising=False)
    return load_settings(None, data_dir=str(tmp_path / "data"))


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    settings.data_dir.mkdir(parents=True)
    s, _ = open_audited(settings)
    yield s
    s.close()


def fill(store: Store, n: int) -> None:
    for i in range(n):
        store.append_audit(AuditEvent(action="test.event", subject=f"s{i}", payload={"i": i}))


def sql(store: Store, statement: str) -> None:
    with store.engine.begin() as connection:
        connection.exec_driver_sql(statement)


def verify(store: Store, settings: Settings, *expected: str) -> list[str]:
    anchors = [ExpectedHead.parse(e) for e in expected]
    report, _ = verify_sealed(store, CheckpointFile(checkpoint_path(settings)), anchors)
    return [str(p) for p in report.problems]


def cli_verify(settings: Settings, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(audit_cli, ["verify", "--data-dir", str(settings.data_dir), *args])
    return result.exit_code, result.output


def row(store: Store, seq: int) -> dict[str, object]:
    with store.engine.connect() as connection:
        found = connection.exec_driver_sql(
            f"SELECT ts, actor_key_id, client_address, action, subject, payload, prev_hash, "
            f"hash, key_id FROM audit_records WHERE seq = {seq}"
        ).one()
    return dict(found._mapping)


# --- the key --------------------------------------------------------------------------------
def test_key_file_is_created_private_and_reused(settings: Settings) -> None:
    key = load_key(settings)
    path = key_file_path(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(settings).id == key.id
    os.chmod(path, 0o644)
    with pytest.raises(AuditKeyError, match="chmod 600"):
        load_key(settings)


def test_key_from_the_environment_wins(settings: Settings, monkeypatch) -> None:
    monkeypatch.setenv("RADSERVE_AUDIT__KEY", "ab" * 32)
    from_env = load_settings(None, data_dir=str(settings.data_dir))
    assert load_key(from_env).secret == bytes.fromhex("ab" * 32)
    assert not key_file_path(from_env).exists()
    monkeypatch.setenv("RADSERVE_AUDIT__KEY", "short")
    with pytest.raises(Exception, match="64 hex digits"):
        load_settings(None, data_dir=str(settings.data_dir))


def test_records_are_hmac_keyed_and_checkpointed(store: Store, settings: Settings) -> None:
    fill(store, 3)
    records = list(store.iter_audit())
    key = store.audit_key
    assert key is not None and {r.key_id for r in records} == {key.id}
    body = {
        "seq": 1,
        "ts": records[0].ts.isoformat(),
        "actor_key_id": None,
        "client_address": None,
        "action": "test.event",
        "subject": "s0",
        "payload": {"i": 0},
    }
    assert records[0].hash == key.mac(GENESIS_HASH + canonical_json(body))
    lines = [json.loads(x) for x in checkpoint_path(settings).read_text().splitlines()]
    assert [line["seq"] for line in lines] == [1, 2, 3]
    assert lines[-1]["head"] == records[-1].hash and lines[-1]["keyed_from"] == 1
    assert verify(store, settings) == []
    code, out = cli_verify(settings)
    assert code == 0 and f"head: 3:{records[-1].hash}" in out and "matches the checkpoint" in out


def test_a_writer_without_the_key_cannot_extend_a_keyed_chain(
    store: Store, settings: Settings
) -> None:
    fill(store, 1)
    keyless = init_store(settings.effective_database_url)
    try:
        with pytest.raises(AuditKeyMissingError):
            keyless.append_audit(AuditEvent(action="x"))
    finally:
        keyless.close()


# --- the four attacks -----------------------------------------------------------------------
def _forge(store: Store, seq: int, prev: str, key: AuditKey | None, key_id: str | None) -> str:
    """Insert record ``seq`` after ``prev`` with a hash computed as a forger can."""
    fields = {
        "seq": seq,
        "ts": row(store, 1)["ts"],
        "actor_key_id": "attacker",
        "client_address": None,
        "action": "key.created",
        "subject": "forged",
        "payload": {},
    }
    import datetime as dt

    ts = fields["ts"]
    ts = ts if isinstance(ts, dt.datetime) else dt.datetime.fromisoformat(str(ts))
    fields["ts"] = ts.replace(tzinfo=ts.tzinfo or dt.UTC)
    digest = record_hash(prev, key=key, **fields)  # type: ignore[arg-type]
    kid = "NULL" if key_id is None else f"'{key_id}'"
    sql(
        store,
        "INSERT INTO audit_records (seq, ts, actor_key_id, client_address, action, subject, "
        f"payload, prev_hash, hash, key_id) SELECT {seq}, ts, 'attacker', NULL, 'key.created', "
        f"'forged', '{{}}', '{prev}', '{digest}', {kid} FROM audit_records WHERE seq = 1",
    )
    sql(store, f"UPDATE audit_head SET seq = {seq}, hash = '{digest}'")
    return digest


@pytest.mark.parametrize("as_keyed", [False, True], ids=["unkeyed", "guessed-key"])
def test_attack_forged_row_with_a_valid_hash(
    store: Store, settings: Settings, as_keyed: bool
) -> None:
    fill(store, 4)
    last = list(store.iter_audit())[-1]
    guessed = AuditKey(b"\x00" * 32)
    digest = _forge(store, 5, last.hash, guessed if as_keyed else None,
                    store.audit_key.id if as_keyed else None)  # type: ignore[union-attr]  # fmt: skip
    found = verify(store, settings)
    expected = "does not match its hash" if as_keyed else "unkeyed record after keyed ones"
    assert any(expected in p for p in found), found
    code, out = cli_verify(settings, "--expect-head", f"5:{digest}")
    assert code == 1 and "BROKEN" in out


def test_attack_tail_cut_and_head_moved_back(store: Store, settings: Settings) -> None:
    fill(store, 6)
    third = list(store.iter_audit())[2]
    sql(store, "DELETE FROM audit_records WHERE seq > 3")
    sql(store, f"UPDATE audit_head SET seq = 3, hash = '{third.hash}'")
    assert store.verify_audit().ok  # the chain alone cannot tell
    found = verify(store, settings)
    said = "saw the chain at seq 6; its last record is now seq 3: records were cut from the end"
    assert any(f"{said} (head moved back)" in p for p in found), found
    code, out = cli_verify(settings)
    assert code == 1 and "cut from the end" in out


def test_the_tail_cut_with_the_head_row_left_names_the_last_record(
    store: Store, settings: Settings
) -> None:
    """Said "the chain now ends at seq 6" (the head row's seq) of a chain whose last
    record was seq 4: the line contradicted itself."""
    fill(store, 6)
    sql(store, "DELETE FROM audit_records WHERE seq > 4")
    found = verify(store, settings)
    said = "its last record is now seq 4: records were cut from the end (its head row still"
    assert any(said in p for p in found), found


def test_attack_edit_rehashed_through_the_end(store: Store, settings: Settings) -> None:
    fill(store, 5)
    sql(store, """UPDATE audit_records SET payload = '{"i":99}' WHERE seq = 2""")
    # rewrite every hash from the edit on, as a forger without the key can (sha256)
    records = list(store.iter_audit())
    prev = records[0].hash
    for record in records[1:]:
        fields = {
            "seq": record.seq, "ts": record.ts, "actor_key_id": record.actor_key_id,
            "client_address": record.client_address, "action": record.action,
            "subject": record.subject, "payload": record.payload,
        }  # fmt: skip
        digest = record_hash(prev, **fields)  # type: ignore[arg-type]
        sql(store, f"UPDATE audit_records SET prev_hash = '{prev}', hash = '{digest}', "
                   f"key_id = NULL WHERE seq = {record.seq}")  # fmt: skip
        prev = digest
    sql(store, f"UPDATE audit_head SET seq = 5, hash = '{prev}'")
    found = verify(store, settings)
    assert any("unkeyed record after keyed ones" in p for p in found), found
    assert any("rewritten" in p for p in found), found
    assert cli_verify(settings)[0] == 1


def test_attack_everything_rehashed_unkeyed_is_caught_by_the_checkpoint(
    store: Store, settings: Settings
) -> None:
    fill(store, 3)
    prev = GENESIS_HASH
    for record in list(store.iter_audit()):
        fields = {
            "seq": record.seq, "ts": record.ts, "actor_key_id": record.actor_key_id,
            "client_address": record.client_address, "action": record.action,
            "subject": record.subject, "payload": record.payload,
        }  # fmt: skip
        digest = record_hash(prev, **fields)  # type: ignore[arg-type]
        sql(store, f"UPDATE audit_records SET prev_hash = '{prev}', hash = '{digest}', "
                   f"key_id = NULL WHERE seq = {record.seq}")  # fmt: skip
        prev = digest
    sql(store, f"UPDATE audit_head SET seq = 3, hash = '{prev}'")
    assert store.verify_audit().ok  # a consistent unkeyed chain, as before keys existed
    found = verify(store, settings)
    assert any("rehashed without the key" in p for p in found), found
    assert any("rewritten" in p for p in found), found


def test_attack_every_record_wiped(store: Store, settings: Settings) -> None:
    fill(store, 4)
    head = store.audit_head()
    sql(store, "DELETE FROM audit_records")
    sql(store, f"UPDATE audit_head SET seq = 0, hash = '{GENESIS_HASH}'")
    assert store.verify_audit().ok  # an empty chain is consistent
    found = verify(store, settings)
    assert any("the chain is empty but the checkpoint" in p and "(wiped)" in p for p in found)
    code, out = cli_verify(settings, "--no-checkpoint", "--expect-head", f"{head[0]}:{head[1]}")
    assert code == 1 and "wiped" in out


def test_checkpoint_file_edits_are_reported(store: Store, settings: Settings) -> None:
    fill(store, 2)
    path = checkpoint_path(settings)
    lines = path.read_text().splitlines()
    forged = json.loads(lines[-1]) | {"seq": 1}
    path.write_text("\n".join([*lines, json.dumps(forged), "not json"]) + "\n")
    found = verify(store, settings)
    assert "checkpoint line 3 has a wrong MAC (forged or edited)" in found
    assert "checkpoint line 4 is unreadable (edited)" in found


def test_a_checkpoint_append_a_crash_cut_short_is_torn_not_edited(
    store: Store, settings: Settings
) -> None:
    fill(store, 3)
    path = checkpoint_path(settings)
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: last + 40])  # the trail cut 40 bytes into its last line
    lines = len(path.read_text().splitlines())
    report, checkpoint = verify_sealed(store, CheckpointFile(path))
    assert report.problems == []  # the checkpoint before it holds
    assert checkpoint is not None and checkpoint.seq == 2
    assert report.notes == [
        f"checkpoint line {lines} is a torn final append: a writer stopped mid-line"
    ]
    code, out = cli_verify(settings)
    assert code == 0 and "torn final append" in out and "edited" not in out


def test_what_follows_a_torn_append_is_still_verified(store: Store, settings: Settings) -> None:
    fill(store, 2)
    path = checkpoint_path(settings)
    lines = path.read_text().splitlines()
    forged = json.loads(lines[-1]) | {"seq": 1}
    swallowed = lines[-1][:30] + lines[-1]  # an append cut short, then run into the next
    path.write_text("\n".join([*lines, lines[-1][:30], json.dumps(forged), swallowed]) + "\n")
    found = verify(store, settings)
    assert found == [
        "checkpoint line 4 has a wrong MAC (forged or edited)",
        "checkpoint line 5 is unreadable (edited)",
    ]
    code, out = cli_verify(settings)
    assert code == 1 and "checkpoint line 3 is a torn append (ended by the next append)" in out


def test_expect_head_that_the_chain_does_not_hold(store: Store, settings: Settings) -> None:
    fill(store, 2)
    code, out = cli_verify(settings, "--expect-head", f"2:{'ab' * 32}")
    assert code == 1 and "rewritten" in out
    code, out = cli_verify(settings, "--expect-head", "nonsense")
    assert code == 2 and "SEQ:HASH" in out


def test_server_checkpoints_on_a_thread_and_at_stop(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True)
    trail = AuditTrail(settings.model_copy(update={}))
    store = init_store(settings.effective_database_url, audit_key=trail.key,
                       on_audit=trail.appended)  # fmt: skip
    trail.attach(store)
    trail.seal.interval_s = 3600  # one checkpoint, then only at stop
    trail.start()
    try:
        fill(store, 5)
    finally:
        trail.stop()
    lines = [json.loads(x) for x in checkpoint_path(settings).read_text().splitlines()]
    assert lines[-1]["seq"] == 5 and len(lines) <= 5
    assert verify(store, settings) == []
    store.close()
