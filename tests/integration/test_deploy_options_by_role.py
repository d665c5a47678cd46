"""A deployment option the role does not take is refused, not ignored (2026-12-08 trial).

``percent`` is a canary's or a shadow's share of studies; ``include_urgent`` is a
canary's. Before, both were accepted with any role and dropped: ``radserve models deploy
STEP 1.1.0 --percent 10 --reason trial`` (``--role`` left at its default, stable) and
``POST /v1/models/STEP/deploy {"version": "1.1.0", "percent": 10, ...}`` made 1.1.0 the
stable version of every study, where a 10 % canary was meant, and answered 200 / exit 0.
Now both doors answer ``deployment_invalid`` (HTTP 409, CLI exit 2) naming the role that
takes the option, and nothing is recorded or routed; the web console never sent them.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories.server_process import radserve_command
from tests.factories.service import auth, config_file, live_server

from radserve.config import load_settings

STEP = "lesions-test"


@dataclass
class Server:
    live: dict[str, Any]
    config: Path
    data: Path

    def deploy(self, **body: Any) -> Any:
        return self.live["client"].post(
            f"/v1/models/{STEP}/deploy",
            json={"version": "1.1.0", "reason": "trial", **body},
            headers=auth(self.live["admin"]),
        )

    def history(self) -> list[dict[str, Any]]:
        answer = self.live["client"].get(
            f"/v1/models/deployments?step={STEP}", headers=auth(self.live["admin"])
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def cli_deploy(self, *options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            radserve_command(
                *("models", "deploy", STEP, "1.1.0", *options, "--reason", "trial"),
                *("--config", str(self.config), "--data-dir", str(self.data)),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("deploy-options")
    config = config_file(root, lifecycle={"poll_s": 0.2})
    models = root / "assets" / "models"
    folder = models / STEP / "1.1.0"  # the test lesion bundle again, as a second version
    shutil.copytree(models / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": "1.1.0"}))
    data = root / "data"
    with live_server(load_settings(config, data_dir=data), roles=("admin",)) as live:
        yield Server(live, config, data)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"percent": 10}, "a stable version serves every study not routed to a canary"),
        ({"role": "stable", "percent": 100}, "deploy it with role canary"),
        ({"role": "stable", "include_urgent": True}, "a stable version serves them already"),
        ({"role": "shadow", "percent": 20, "include_urgent": True}, "a shadow version runs"),
    ],
)
def test_the_api_refuses_an_option_the_role_does_not_take(
    server: Server, body: dict[str, Any], says: str
) -> None:
    answer = server.deploy(**body)
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "deployment_invalid" and says in error["message"], error
    assert server.history() == []  # nothing recorded, nothing routed
    assert STEP not in server.live["service"].lifecycle.active()


def test_the_cli_refuses_a_percent_without_a_canary_or_shadow_role(server: Server) -> None:
    ran = server.cli_deploy("--percent", "10")
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "error [deployment_invalid]" in ran.stderr
    assert "deploy it with role canary" in ran.stderr
    ran = server.cli_deploy("--role", "shadow", "--percent", "10", "--include-urgent")
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "include_urgent routes URGENT studies to a canary" in ran.stderr
    assert server.history() == []


def test_the_roles_that_take_the_options_still_deploy(server: Server) -> None:
    answer = server.deploy(version="1.0.0", role="canary", percent=10, include_urgent=True)
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert (out["canary"], out["canary_percent"], out["canary_urgent"]) == ("1.0.0", 10, True)
    answer = server.deploy(version="1.0.0", role="stable")  # no percent: the canary is stable
    assert answer.status_code == 200, answer.text
    assert (answer.json()["stable"], answer.json()["canary"]) == ("1.0.0", None)
