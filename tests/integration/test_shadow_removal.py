"""A shadow deployment can be stopped, over the API (admin) and with the CLI, against a
real running server: the step keeps its stable version, no study is sampled for the
shadow any more, and the change is a ``model_deployments`` row with its audit record. A
step with no shadow answers 409 ``no_shadow``; ``--percent 0`` stays refused but names
the way to stop a shadow. (Before, nothing could remove a shadow.)"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories.server_process import radserve_command
from tests.factories.service import auth, config_file, live_server
from tests.factories.waits import until

from radserve.config import load_settings

STEP = "lesions-test"


@dataclass
class Shadowed:
    """A running server whose step serves 1.1.0 and shadows 1.0.0 on half the studies."""

    live: dict[str, Any]
    config: Path
    data: Path

    @property
    def admin(self) -> dict[str, str]:
        return auth(self.live["admin"])

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return self.live["client"].post(path, json=body, headers=headers or self.admin)

    def shadow(self, percent: float) -> Any:
        body = {"version": "1.0.0", "role": "shadow", "percent": percent, "reason": "trial"}
        return self.post(f"/v1/models/{STEP}/deploy", body)

    def undeploy(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return self.post(f"/v1/models/{STEP}/undeploy", body, headers)

    def history(self) -> list[dict[str, Any]]:
        return (
            self.live["client"]
            .get(f"/v1/models/deployments?step={STEP}", headers=self.admin)
            .json()
        )

    def shadow_now(self) -> str | None:
        return self.live["service"].lifecycle.active()[STEP].shadow

    def audits(self) -> list[dict[str, Any]]:
        """The audit payloads (and actor) of this step's deployment changes, oldest first."""
        return [
            {**r.payload, "actor": r.actor_key_id}
            for r in self.live["service"].store.iter_audit()
            if r.action == "model.changed" and r.subject == STEP
        ]

    def cli_undeploy(self) -> subprocess.CompletedProcess[str]:
        """``radserve models undeploy STEP --role shadow`` as a user runs it (no reason)."""
        return subprocess.run(
            radserve_command(
                *("models", "undeploy", STEP, "--role", "shadow"),
                *("--config", str(self.config), "--data-dir", str(self.data)),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture
def shadowed(tmp_path: Path) -> Iterator[Shadowed]:
    config = config_file(tmp_path, lifecycle={"poll_s": 0.2})
    data = tmp_path / "data"
    models = tmp_path / "assets" / "models"
    folder = models / STEP / "1.1.0"  # the test lesion bundle again: it serves (the latest)
    shutil.copytree(models / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": "1.1.0"}))
    with live_server(load_settings(config, data_dir=data), roles=("admin", "read")) as live:
        s = Shadowed(live, config, data)
        assert s.shadow(50).status_code == 200
        assert s.shadow_now() == "1.0.0" and live["service"].lifecycle.needs_routing()
        yield s


def test_the_api_removes_a_shadow_recorded_and_audited(shadowed: Shadowed) -> None:
    s = shadowed
    read = auth(s.live["read"])
    assert s.undeploy({"role": "shadow", "reason": "x"}, headers=read).status_code == 403
    assert s.undeploy({"role": "canary", "reason": "x"}).status_code == 400  # rollback's job
    rows_before, audits_before = len(s.history()), len(s.audits())
    removed = s.undeploy({"role": "shadow", "reason": "comparison finished"})
    assert removed.status_code == 200, removed.text
    out = removed.json()
    assert (out["stable"], out["shadow"], out["shadow_percent"]) == ("1.1.0", None, 0.0)
    assert out["reason"] == "comparison finished" and out["actor"]
    assert out["action"] == "undeploy"  # recorded as what it is, not as a deploy
    # applied at once: no study is sampled for a shadow any more
    assert s.shadow_now() is None
    assert not s.live["service"].lifecycle.needs_routing()
    listed = s.live["client"].get("/v1/models", headers=read).json()
    assert next(d for d in listed["deployments"] if d["step"] == STEP)["shadow"] is None
    assert [v for v in listed["versions"] if "shadow" in v.get("deployed", [])] == []
    # recorded and audited like every deployment change
    history = s.history()
    assert len(history) == rows_before + 1 and history[0]["id"] == out["id"]
    audits = s.audits()
    assert len(audits) == audits_before + 1
    assert audits[-1]["deployment_id"] == out["id"] and audits[-1]["shadow"] is None
    assert audits[-1]["event"] == "deployment.undeploy"
    assert audits[-1]["reason"] == "comparison finished"
    assert audits[-1]["actor"] == out["actor"]


def test_removing_a_shadow_that_is_not_there_is_a_409_with_its_code(shadowed: Shadowed) -> None:
    s = shadowed
    assert s.undeploy({"role": "shadow"}).status_code == 200  # the reason is optional
    rows = len(s.history())
    again = s.undeploy({"role": "shadow"})
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "no_shadow"
    assert f"{STEP} has no shadow" in again.json()["error"]["message"]
    assert len(s.history()) == rows  # nothing recorded


def test_percent_zero_stays_refused_and_names_the_way_to_stop_a_shadow(
    shadowed: Shadowed,
) -> None:
    zero = shadowed.shadow(0)
    assert zero.status_code == 409, zero.text
    message = zero.json()["error"]["message"]
    assert f"radserve models undeploy {STEP} --role shadow" in message
    assert f"POST /v1/models/{STEP}/undeploy" in message
    assert shadowed.shadow_now() == "1.0.0"  # unchanged


def test_the_cli_removes_a_shadow_and_the_running_server_applies_it(shadowed: Shadowed) -> None:
    s = shadowed
    done = s.cli_undeploy()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{STEP}: stable 1.1.0 (undeploy)"
    until(lambda: s.shadow_now() is None, "the server to apply the CLI's removal", 30)
    newest = s.history()[0]
    assert newest["shadow"] is None and newest["reason"] is None
    assert newest["actor"].startswith("cli")
    assert s.audits()[-1]["deployment_id"] == newest["id"]
    refused = s.cli_undeploy()
    assert refused.returncode == 2
    assert "error [no_shadow]" in refused.stderr and "has no shadow" in refused.stderr


def test_deployment_changes_at_once_each_keep_the_other_s(shadowed: Shadowed) -> None:
    """A canary and a shadow deployed at the same moment: each request read the step's
    state and recorded its own change on it, so the later row dropped the other's (the
    canary vanished under the shadow's row). Five rounds of both at once."""
    s = shadowed
    canary = {"version": "1.0.0", "role": "canary", "percent": 10, "reason": "trial"}
    for _ in range(5):
        assert s.undeploy({"role": "shadow"}).status_code == 200
        rollback = s.post(f"/v1/models/{STEP}/rollback", {"reason": "reset"})
        assert rollback.status_code in (200, 409), rollback.text
        answers: list[int] = []

        def deploy_canary(out: list[int] = answers) -> None:
            out.append(s.post(f"/v1/models/{STEP}/deploy", canary).status_code)

        def deploy_shadow(out: list[int] = answers) -> None:
            out.append(s.shadow(50).status_code)

        threads = [threading.Thread(target=deploy_canary), threading.Thread(target=deploy_shadow)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert answers == [200, 200]
        active = s.live["service"].lifecycle.active()[STEP]
        assert (active.stable, active.canary, active.shadow) == ("1.1.0", "1.0.0", "1.0.0")
        latest = s.history()[0]
        assert (latest["canary"], latest["shadow"]) == ("1.0.0", "1.0.0"), latest
