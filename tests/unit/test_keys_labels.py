"""``radserve keys create`` refuses a name, site or submitter with a control or line
separating character: a newline in ``--name`` printed a forged row in ``radserve keys
list`` (an id, role and dates of the attacker's choosing under the real one). A name
stored before the check prints on one line. The real command on a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.commands.keys import group as keys_cli
from radserve.commands.keys import open_store

FORGED = "ops\nffffffffffffffff  admin   2026-01-01 00:00:00  -                    root"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.delenv("RADSERVE_DATABASE_URL", raising=False)
    monkeypatch.delenv("RADSERVE_CONFIG", raising=False)
    return ["--data-dir", str(tmp_path)]


@pytest.mark.parametrize("option", ["--name", "--site", "--submitter"])
@pytest.mark.parametrize(
    "value", [FORGED, "ops\r", "a\x1b[2Jb", "x\u2028y", "bi\u202edi", "", "n" * 129]
)
def test_create_refuses_control_characters(data: list[str], option: str, value: str) -> None:
    runner = CliRunner()
    first = runner.invoke(keys_cli, ["create", "--role", "read", "--name", "first", *data])
    assert first.exit_code == 0, first.output
    created = runner.invoke(keys_cli, ["create", "--role", "read", option, value, *data])
    assert created.exit_code == 2, created.output
    assert f"Invalid value for '{option}'" in created.output
    assert "rsk_" not in created.output
    listed = runner.invoke(keys_cli, ["list", *data])
    assert listed.exit_code == 0, listed.output
    [row] = listed.output.splitlines()[1:]  # no second key
    assert row.endswith("first")


def test_a_plain_name_is_kept_and_an_old_forged_one_lists_on_one_line(data: list[str]) -> None:
    runner = CliRunner()
    created = runner.invoke(
        keys_cli, ["create", "--role", "read", "--name", "Radiologie Süd – Leitstand", *data]
    )
    assert created.exit_code == 0, created.output
    store = open_store(None, Path(data[1]))  # as the command opens it (audit key)
    try:  # as a key created before the check could have been named
        store.create_api_key(name=FORGED, role="read")
    finally:
        store.close()
    listed = runner.invoke(keys_cli, ["list", *data])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert len(lines) == 3, lines  # the header and two keys
    assert lines[1].endswith("Radiologie Süd – Leitstand")
    assert lines[2].endswith(
        "ops\\nffffffffffffffff  admin   2026-01-01 00:00:00  -" + " " * 20 + "root"
    )


def test_the_default_name_is_the_one_the_help_names(data: list[str]) -> None:
    """``--help`` said the default name was the role; the key was named ``read key``."""
    runner = CliRunner()
    created = runner.invoke(keys_cli, ["create", "--role", "read", *data])
    assert created.exit_code == 0, created.output
    listed = runner.invoke(keys_cli, ["list", *data])
    [row] = listed.output.splitlines()[1:]
    assert row.endswith("read key")
    shown = runner.invoke(keys_cli, ["create", "--help"], terminal_width=200)
    assert "(default: ROLE key, e.g. admin key)" in shown.output, shown.output
