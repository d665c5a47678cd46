"""``radserve console users`` with no user to list says why: no settings file given at all
(the first try of someone who wrote console.users into radserve.yaml and ran the command
bare), or a file whose console.users is empty, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from radserve.cli import cli


def test_no_settings_file_is_named_as_the_reason_for_no_users(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RADSERVE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)  # a radserve.yaml here is not read without --config
    (tmp_path / "radserve.yaml").write_text(
        yaml.safe_dump({"console": {"users": [{"username": "alice", "role": "admin"}]}})
    )
    bare = CliRunner().invoke(cli, ["console", "users"])
    assert bare.exit_code == 0, bare.output
    assert bare.output == (
        "no local users: no settings file given (--config FILE or $RADSERVE_CONFIG); "
        "`radserve serve` reads console.users from the file it is given the same way\n"
    )


def test_a_settings_file_without_users_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RADSERVE_CONFIG", raising=False)
    config = tmp_path / "site.yaml"
    config.write_text(yaml.safe_dump({"console": {"session_ttl_s": 3600}}))
    for args, env in (
        (["console", "users", "--config", str(config)], {}),
        (["console", "users"], {"RADSERVE_CONFIG": str(config)}),
    ):
        listed = CliRunner().invoke(cli, args, env=env)
        assert listed.exit_code == 0, listed.output
        assert listed.output == f"no local users in {config} (console.users is empty)\n"
