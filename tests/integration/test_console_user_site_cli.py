"""A local console user's site, from where users are made to where they are used:
``radserve console hash-password --username … --site …`` prints an entry with the site,
the settings take it (a site that is not one line of text is refused, as for keys),
``radserve console users`` lists it (never the hash), and a server with those settings
signs the user in with that site (what the site then lets it see:
tests/integration/test_site_visibility_names.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner
from tests.factories.service import ServerThread, config_file, settings_for

from radserve.api import create_app
from radserve.cli import cli
from radserve.config import ConfigError, load_settings
from radserve.console import install as install_console
from radserve.service import Service

pytestmark = pytest.mark.slow

PASSWORD = "wall-screen-north-1"


def _entry(*flags: str) -> dict[str, str]:
    args = ["console", "hash-password", "--stdin", "--username", "nurse", "--role", "read"]
    done = CliRunner().invoke(cli, [*args, *flags], input=PASSWORD + "\n")
    assert done.exit_code == 0, done.output
    users: list[dict[str, str]] = yaml.safe_load(done.stdout)["console"]["users"]
    assert len(users) == 1
    return users[0]


def test_a_user_s_site_goes_from_hash_password_to_the_session(tmp_path: Path) -> None:
    # "no" would be a YAML boolean unquoted: the entry quotes it
    assert _entry("--site", "no", "--submitter", "radiology a")["site"] == "no"
    user = _entry("--site", "north")
    assert user["site"] == "north" and "submitter" not in user
    config = config_file(tmp_path, console={"users": [user]})

    listed = CliRunner().invoke(cli, ["console", "users", "--config", str(config), "--json"])
    assert listed.exit_code == 0, listed.output
    assert [json.loads(line) for line in listed.stdout.splitlines()] == [
        {"username": "nurse", "role": "read", "site": "north", "submitter": None}
    ]
    table = CliRunner().invoke(cli, ["console", "users", "--config", str(config)])
    assert table.exit_code == 0 and "north" in table.stdout
    assert user["password_hash"] not in table.stdout + listed.stdout

    # a site as keys refuse it: not one line of printable text
    for bad in ("north\nsouth", "", "x" * 129):
        with pytest.raises(ConfigError):
            load_settings(None, console__users=[{**user, "site": bad}])
    refused = CliRunner().invoke(
        cli,
        ["console", "hash-password", "--stdin", "--username", "x", "--site", "a\u2028b"],
        input=PASSWORD + "\n",
    )
    assert refused.exit_code != 0 and "control character" in refused.output

    service = Service(settings_for(tmp_path, security__visibility="site", console__users=[user]))
    app = create_app(service)
    install_console(app, service)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/console/api/session", json={"username": "nurse", "password": PASSWORD})
        assert r.status_code == 200, r.text
        assert (r.json()["site"], r.json()["user"]) == ("north", "nurse")
        assert c.get("/console/api/session").json()["site"] == "north"
