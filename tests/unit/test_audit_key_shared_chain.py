"""A server that finds no audit key of its own never starts a second key on a chain
that is already keyed: with several replicas on one PostgreSQL, a replica whose local
data folder lacks the key wrote its records under a new key, and the others' `radserve
audit verify` reported them as hashed with a foreign key. It is refused, naming the
chain's key id and where the key goes; with the others' key it writes a chain that
verifies; a replica holding a different key is refused as well. SQLite and PostgreSQL."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.postgres import postgres_schema

from radserve.audit import AuditEvent
from radserve.audit.seal import AuditKeyError, CheckpointFile, checkpoint_path, verify_sealed
from radserve.config import Settings, load_settings
from radserve.store.audit import AuditKeyMismatchError
from radserve.store.audited import open_audited


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    for name in ("RADSERVE_DATABASE_URL", "RADSERVE_CONFIG", "RADSERVE_AUDIT__KEY"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    with postgres_schema("radserve_auditkey") as url:
        yield url


def _replica(tmp_path: Path, name: str, url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("RADSERVE_DATABASE_URL", url)
    data = tmp_path / name
    data.mkdir()
    return load_settings(None, data_dir=str(data))


def _append(settings: Settings, subject: str) -> None:
    store, _trail = open_audited(settings)
    try:
        store.append_audit(AuditEvent(action="test.event", subject=subject, payload={}))
    finally:
        store.close()


def _problems(settings: Settings) -> list[str]:
    store, _trail = open_audited(settings, create=False)
    try:
        report, _ = verify_sealed(store, CheckpointFile(checkpoint_path(settings)), [])
    finally:
        store.close()
    return [str(p) for p in report.problems]


def test_a_replica_without_the_key_is_refused_and_creates_none(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _replica(tmp_path, "first", database_url, monkeypatch)
    _append(first, "by the first replica")
    first_key = first.data_dir / "audit" / "audit.key"
    second = _replica(tmp_path, "second", database_url, monkeypatch)
    with pytest.raises(AuditKeyError, match=r"keyed with audit key [0-9a-f]{16}") as refused:
        open_audited(second)
    message = refused.value.message
    assert str(second.data_dir / "audit" / "audit.key") in message
    assert "RADSERVE_AUDIT__KEY" in message and "audit.key_file" in message
    assert not (second.data_dir / "audit" / "audit.key").exists()

    (second.data_dir / "audit").mkdir(mode=0o700)
    shutil.copy2(first_key, second.data_dir / "audit" / "audit.key")
    _append(second, "by the second replica, with the first one's key")
    assert _problems(first) == [] and _problems(second) == []


def test_a_replica_with_another_key_is_refused(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _replica(tmp_path, "first", database_url, monkeypatch)
    _append(first, "by the first replica")
    own_key = tmp_path / "own.key"
    own_key.write_text("cd" * 32 + "\n")
    os.chmod(own_key, 0o600)
    monkeypatch.setenv("RADSERVE_AUDIT__KEY_FILE", str(own_key))
    other = _replica(tmp_path, "other", database_url, monkeypatch)
    with pytest.raises(
        AuditKeyError, match=rf"{re.escape(str(own_key))} is audit key [0-9a-f]{{16}}"
    ):
        open_audited(other)
    monkeypatch.delenv("RADSERVE_AUDIT__KEY_FILE")
    assert _problems(first) == []


def test_an_empty_chain_still_gets_a_key_at_first_start(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _replica(tmp_path, "first", database_url, monkeypatch)
    _append(first, "first record")
    assert (first.data_dir / "audit" / "audit.key").exists()
    assert _problems(first) == []


def test_replicas_opened_together_on_an_empty_chain_keep_one_key(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both open before either appends (each makes a key of its own: the chain is empty
    then); the first append keys the chain, the other's first append is refused."""
    first = _replica(tmp_path, "first", database_url, monkeypatch)
    second = _replica(tmp_path, "second", database_url, monkeypatch)
    stores = [open_audited(first)[0], open_audited(second)[0]]
    try:
        stores[0].append_audit(AuditEvent(action="test.event", subject="a", payload={}))
        with pytest.raises(AuditKeyMismatchError, match="nothing was appended"):
            stores[1].append_audit(AuditEvent(action="test.event", subject="b", payload={}))
        stores[0].append_audit(AuditEvent(action="test.event", subject="c", payload={}))
    finally:
        for store in stores:
            store.close()
    assert _problems(first) == []
