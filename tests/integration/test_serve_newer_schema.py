"""``radserve serve`` against a database a newer radserve migrated (an Alembic revision
this code does not know, as after a rollback of the servers but not of the database, or
an older replica started beside upgraded ones): it refuses to start with one line,
``schema_not_current``, exit 2, and changes nothing. Before, Alembic's ``Can't locate
revision`` escaped as a 60-line traceback (exit 1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from tests.factories.postgres import postgres_schema
from tests.factories.server_process import run_radserve
from tests.factories.service import config_file

from radserve.store import init_store
from radserve.store.db import make_engine
from radserve.store.errors import SchemaNotCurrentError
from radserve.store.migrate import current_revision, head_revision

NEWER = "9999_from_a_newer_radserve"


def _stamp_newer(url: str) -> None:
    """A store at head, then stamped with a revision this code has never heard of."""
    init_store(url).close()
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": NEWER})
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def newer_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        (tmp_path / "data").mkdir()
        url = f"sqlite:///{tmp_path / 'data' / 'radserve.db'}"
        _stamp_newer(url)
        yield url
        return
    with postgres_schema("radserve_newer") as url:
        _stamp_newer(url)
        yield url


def _revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


def test_opening_a_newer_schema_for_serve_is_refused_and_changes_nothing(
    newer_store: str,
) -> None:
    with pytest.raises(SchemaNotCurrentError) as refused:
        init_store(newer_store, schema="upgrade")
    message = str(refused.value)
    assert NEWER in message and head_revision() in message
    assert "newer radserve" in message
    assert _revision(newer_store) == NEWER


def test_serve_on_a_newer_schema_exits_with_one_clear_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _stamp_newer(f"sqlite:///{data / 'radserve.db'}")
    config = config_file(tmp_path)
    served = run_radserve(
        "serve", "--port", "0", "--config", str(config), "--data-dir", str(data), timeout=300
    )
    output = served.stdout + served.stderr
    assert served.returncode == 2, output[-3000:]
    assert "error [schema_not_current]" in output
    assert NEWER in output and "newer radserve" in output
    assert "Traceback" not in output
    assert _revision(f"sqlite:///{data / 'radserve.db'}") == NEWER
