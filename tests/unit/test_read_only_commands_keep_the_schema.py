"""Commands other than ``radserve serve`` never upgrade a store whose schema is older than
the code, those that only read nor those that write: a newer checkout pointed at
production's database would otherwise migrate it under the older servers still running
on it. They say which revision they found, which one they need and how to upgrade, exit
2, and leave the revision (and the folder) as it was. A writing command on an empty
database creates a store at head (that is no upgrade)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from tests.factories.postgres import postgres_schema

from radserve.cli import cli
from radserve.store.db import make_engine
from radserve.store.errors import SchemaNotCurrentError
from radserve.store.migrate import alembic_config, current_revision, head_revision, upgrade

READERS = [
    ["audit", "verify"],
    ["audit", "export", "--out", "audit.jsonl"],
    ["outbox", "list"],
    ["outbox", "retry", "1"],
    ["keys", "list"],
    ["models", "list", "--json"],
    ["plan", "--replay", "3"],
    ["export", "0123456789abcdef", "--deidentify", "--out", "exported"],
]
WRITERS = [  # upgraded the store until session 19's follow-up
    ["keys", "create", "--role", "read"],
    ["keys", "revoke", "1"],
    ["models", "install", "bundle"],
    ["models", "deploy", "liver", "1.0.0", "--reason", "r"],
    ["models", "promote", "liver", "--reason", "r"],
    ["models", "rollback", "liver", "--reason", "r"],
]


@pytest.fixture(params=["sqlite", "postgresql"])
def older_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A data folder whose store is one migration behind the code; yields its URL."""
    for name in ("RADSERVE_DATA_DIR", "RADSERVE_DATABASE_URL", "RADSERVE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'data' / 'radserve.db'}"
        _migrate_to_one_before_head(url)
        yield url
        return
    with postgres_schema("radserve_readonly") as url:
        monkeypatch.setenv("RADSERVE_DATABASE_URL", url)
        _migrate_to_one_before_head(url)
        yield url


def previous_revision() -> str:
    """The revision just before head (what a store one release behind is at); only this
    test needs it, so it is here, not in radserve.store.migrate."""
    down = ScriptDirectory.from_config(alembic_config()).get_revision(head_revision()).down_revision
    assert isinstance(down, str), f"the head migration {head_revision()} has no single parent"
    return down


def _migrate_to_one_before_head(url: str) -> None:
    engine = make_engine(url)
    try:
        upgrade(engine, previous_revision())
    finally:
        engine.dispose()


def _revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


def _written(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("args", READERS + WRITERS, ids=lambda a: " ".join(a[:2]))
def test_a_command_other_than_serve_on_an_older_schema_says_so_and_upgrades_nothing(
    older_store: str, tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "bundle").mkdir()  # what `models install` is given
    before, folder = _revision(older_store), _written(tmp_path)
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, SchemaNotCurrentError), result.output
    message = result.exception.message
    assert f"schema revision {before}" in message and head_revision() in message
    assert "radserve serve" in message and "nothing was changed" in message
    assert _revision(older_store) == before != head_revision()
    assert _written(tmp_path) == folder  # no audit key, no checkpoint file either


def test_doctor_reports_the_older_schema_without_upgrading_it(older_store: str) -> None:
    before = _revision(older_store)
    CliRunner().invoke(cli, ["doctor", "--no-ports", "--json"])
    assert _revision(older_store) == before


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_writing_command_on_an_empty_database_creates_the_store_and_reads_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Creating a store at head on an empty database is no upgrade: `keys create` makes
    a fresh store's first key, as the docs' quick start does."""
    for name in ("RADSERVE_DATA_DIR", "RADSERVE_DATABASE_URL", "RADSERVE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "data"
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{data / 'radserve.db'}"
        else:
            url = stack.enter_context(postgres_schema("radserve_fresh"))
            monkeypatch.setenv("RADSERVE_DATABASE_URL", url)
        created = CliRunner().invoke(
            cli, ["keys", "create", "--role", "read", "--data-dir", str(data)]
        )
        assert created.exit_code == 0, created.output
        assert _revision(url) == head_revision()
        listed = CliRunner().invoke(cli, ["keys", "list", "--data-dir", str(data)])
        assert listed.exit_code == 0, listed.output
        assert "read key" in listed.output
