"""Commands that only read create nothing: run in the wrong folder (or before the first
``radserve serve``), ``doctor``, ``models list``, ``config show`` and ``plan --rate``
report without a store, and ``audit``, ``outbox``, ``keys list``, ``plan --replay`` and
``export`` say "no data folder at …"; no data dir, SQLite file or audit key appears."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli
from radserve.store.errors import NoDataError

REFUSED = [
    ["audit", "verify"],
    ["audit", "export", "--out", "audit.jsonl"],
    ["outbox", "list"],
    ["outbox", "retry", "1"],
    ["keys", "list"],
    ["plan", "--replay", "3"],
    ["export", "0123456789abcdef", "--deidentify", "--out", "exported"],
]


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder whose ./data is the data dir (the defaults)."""
    for name in ("RADSERVE_DATA_DIR", "RADSERVE_DATABASE_URL", "RADSERVE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _written(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("args", REFUSED, ids=lambda a: " ".join(a[:2]))
def test_a_reading_command_without_a_store_says_so_and_writes_nothing(
    fresh: Path, args: list[str]
) -> None:
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, NoDataError), result.output
    assert f"no data folder at {fresh / 'data'}" in result.exception.message
    assert _written(fresh) == []


def test_an_existing_folder_without_a_database_is_not_given_one(fresh: Path) -> None:
    """``--data-dir`` naming some other folder: "no database at", and nothing added."""
    other = fresh / "not-radserve"
    other.mkdir()
    result = CliRunner().invoke(cli, ["outbox", "list", "--data-dir", str(other)])
    assert isinstance(result.exception, NoDataError)
    assert f"no database at {other / 'radserve.db'}" in result.exception.message
    assert _written(fresh) == ["not-radserve"]


def test_doctor_fails_a_store_that_serve_could_not_create(fresh: Path) -> None:
    """A data folder that cannot be made (under a regular file): blocking, named."""
    (fresh / "a-file").write_text("not a folder")
    args = ["doctor", "--no-ports", "--json", "--data-dir", str(fresh / "a-file" / "data")]
    doctor = CliRunner().invoke(cli, args)
    database = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
    assert database["status"] == "fail" and database["blocking"] is True
    assert f"{fresh / 'a-file'} is not a folder: serve cannot create it" in database["detail"]
    assert doctor.exit_code != 0
    assert _written(fresh) == ["a-file"]


def test_doctor_connects_to_a_server_database_without_a_data_folder(fresh: Path) -> None:
    """A PostgreSQL store is checked by connecting (that creates nothing here), not
    passed as "created at the first serve" because the local folder is absent."""
    url = os.environ.get("RADSERVE_TEST_DATABASE_URL")
    if not url:
        pytest.skip("RADSERVE_TEST_DATABASE_URL not set")
    args = ["doctor", "--no-ports", "--json"]
    doctor = CliRunner().invoke(cli, args, env={"RADSERVE_DATABASE_URL": url})
    database = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
    assert database["status"] == "ok" and database["detail"].startswith("reachable")
    assert _written(fresh) == []


def test_doctor_models_list_config_show_and_plan_report_without_a_store(fresh: Path) -> None:
    runner = CliRunner()
    doctor = runner.invoke(cli, ["doctor", "--no-ports", "--json"])
    assert doctor.exception is None or isinstance(doctor.exception, SystemExit)
    database = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
    assert database["status"] == "ok"  # serve can create it here: a fresh host is not a fault
    assert database["detail"].startswith(f"no data folder at {fresh / 'data'}")
    assert "created at the first serve" in database["detail"]

    listed = runner.invoke(cli, ["models", "list", "--json"], catch_exceptions=False)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert {"stable"} == {role for r in rows for role in r.get("deployed", [])}
    assert all(r["canary_percent"] is None for r in rows if "error" not in r)
    assert "no stored deployment" in listed.stderr and "nothing was written" in listed.stderr

    shown = runner.invoke(cli, ["config", "show"], catch_exceptions=False)
    assert shown.exit_code == 0 and "data_dir" in shown.stdout

    planned = runner.invoke(
        cli, ["plan", "--rate", "urgent=2/h", "--hours", "24", "--json"], catch_exceptions=False
    )
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["service_times"]["measured"] is False
    assert _written(fresh) == []
