"""API keys: roles, hashing, create/verify/revoke/list, and the ``radserve keys`` commands.

Tests that take only ``store`` also run against PostgreSQL
(tests/integration/test_store_postgres.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from radserve.commands.keys import group as keys_cli
from radserve.security import Role, generate_key, parse_token, role_allows
from radserve.store import ApiKeyNotFoundError, Store, init_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


@pytest.mark.parametrize(
    ("role", "allowed"),
    [
        (Role.READ, {Role.READ}),
        (Role.SUBMIT, {Role.READ, Role.SUBMIT}),
        (Role.ADMIN, {Role.READ, Role.SUBMIT, Role.ADMIN}),
    ],
)
def test_role_grants_are_nested(role: Role, allowed: set[Role]) -> None:
    assert {r for r in Role if role_allows(role, r)} == allowed


def test_generated_key_parses_and_hides_its_token() -> None:
    new = generate_key()
    assert parse_token(new.token) == (new.key_id, new.token.split("_", 2)[2])
    assert new.token not in repr(new)
    assert parse_token("rsk_short_x") is None
    assert parse_token("") is None


def test_key_verifies_and_only_its_hash_is_stored(store: Store) -> None:
    record, token = store.create_api_key(name="ris", role="submit")
    assert record.role == "submit" and record.active
    assert store.verify_api_key(token) == record
    secret = token.split("_", 2)[2]
    with store.engine.connect() as connection:
        row = connection.execute(
            text("SELECT salt, hash FROM api_keys WHERE id = :id"), {"id": record.id}
        ).one()
    assert secret not in row.salt + row.hash and token not in row.salt + row.hash


def test_wrong_malformed_and_unknown_keys_are_refused(store: Store) -> None:
    _, token = store.create_api_key(name="a", role="read")
    prefix, key_id, secret = token.split("_", 2)
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    other_id = "0" * 16 if key_id != "0" * 16 else "1" * 16
    for bad in (f"{prefix}_{key_id}_{flipped}", f"{prefix}_{other_id}_{secret}", "garbage", ""):
        assert store.verify_api_key(bad) is None


def test_revoked_key_is_refused_and_revoke_is_idempotent(store: Store) -> None:
    record, token = store.create_api_key(name="old", role="admin")
    revoked = store.revoke_api_key(record.id, actor_key_id="root")
    assert revoked.revoked is not None and not revoked.active
    assert store.verify_api_key(token) is None
    assert store.revoke_api_key(record.id).revoked == revoked.revoked
    with pytest.raises(ApiKeyNotFoundError, match="no API key with id 'nope'"):
        store.revoke_api_key("nope")


def test_list_keys_and_audit_trail(store: Store) -> None:
    a, _ = store.create_api_key(name="a", role="read")
    b, _ = store.create_api_key(name="b", role="admin", actor_key_id="root")
    store.revoke_api_key(a.id)
    assert [k.id for k in store.list_api_keys()] == [a.id, b.id]
    assert [k.id for k in store.list_api_keys(include_revoked=False)] == [b.id]
    trail = [(r.action, r.subject, r.actor_key_id) for r in store.iter_audit()]
    assert trail == [
        ("key.created", a.id, None),
        ("key.created", b.id, "root"),
        ("key.revoked", a.id, None),
    ]
    assert all("hash" not in r.payload and "salt" not in r.payload for r in store.iter_audit())


def test_cli_create_list_revoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADSERVE_DATABASE_URL", raising=False)
    monkeypatch.delenv("RADSERVE_CONFIG", raising=False)
    runner = CliRunner()
    data = ["--data-dir", str(tmp_path)]
    created = runner.invoke(keys_cli, ["create", "--role", "admin", "--name", "ops", *data])
    assert created.exit_code == 0, created.output
    token = created.stdout.strip().splitlines()[-1]

    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        key = store.verify_api_key(token)
        assert key is not None and key.role == "admin" and key.name == "ops"
    finally:
        store.close()

    listed = runner.invoke(keys_cli, ["list", *data])
    assert listed.exit_code == 0 and key.id in listed.output and "ops" in listed.output
    assert token not in listed.output

    revoked = runner.invoke(keys_cli, ["revoke", key.id, *data])
    assert revoked.exit_code == 0, revoked.output
    # a running server remembers a checked key for 10 s: said, not "from now on"
    assert "a running server refuses it within 10 s" in revoked.output
    as_json = runner.invoke(keys_cli, ["list", "--json", *data])
    assert '"revoked": null' not in as_json.output
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        assert store.verify_api_key(token) is None
    finally:
        store.close()

    bad_role = runner.invoke(keys_cli, ["create", "--role", "root", *data])
    assert bad_role.exit_code == 2 and "root" in bad_role.output
