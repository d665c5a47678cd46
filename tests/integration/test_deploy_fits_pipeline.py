"""A version is refused at deployment when a pipeline that runs its step would not load
with it: a lesion model restricted to an organ the organ step does not segment, or
judged by the contrast of a structure it does not produce, would fail every study routed
to it (a canary: a share of the routine studies) at its first step. The refusal names
the pipeline and the rule; the version that fits deploys."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from tests.factories.service import auth, live_server, settings_for

STEP = "lesions-test"


def _version(models: Path, version: str, change: dict[str, Any]) -> None:
    """The test lesion bundle again as ``version``, its manifest updated with ``change``
    (one level deep)."""
    folder = models / STEP / version
    shutil.copytree(models / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["version"] = version
    for key, value in change.items():
        if isinstance(value, dict):
            manifest.setdefault(key, {}).update(value)
        else:
            manifest[key] = value
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))


def test_a_version_that_does_not_fit_the_pipeline_is_refused_at_deployment(tmp_path: Path):
    settings = settings_for(tmp_path)
    models = Path(settings.models.dirs[0])
    _version(models, "1.1.0", {"input": {"roi_labels": ["spleen"]}})
    _version(models, "1.2.0", {"input_domain": {"structure_hu": {"aorta": {"min": 150.0}}}})
    _version(models, "1.3.0", {"input_domain": {"structure_hu": {"liver": {"min": -100.0}}}})
    with live_server(settings, roles=("admin",)) as s:
        c, admin = s["client"], s["admin"]

        def deploy(version: str, role: str = "canary") -> Any:
            share = {} if role == "stable" else {"percent": 10}  # a stable takes no share
            body = {"version": version, "role": role, **share, "reason": "trial"}
            return c.post(f"/v1/models/{STEP}/deploy", json=body, headers=auth(admin))

        refused = deploy("1.1.0")
        assert refused.status_code == 409, refused.text
        message = refused.json()["error"]["message"]
        assert message.startswith(
            "lesions-test/1.1.0 does not fit pipeline 'test-pipeline': rule 'upstream labels'"
        ), message
        assert "input.roi_labels names 'spleen', which no earlier step produces" in message
        refused = deploy("1.2.0", role="stable")
        assert refused.status_code == 409, refused.text
        assert "input_domain.structure_hu names 'aorta'" in refused.json()["error"]["message"]
        # nothing changed: the stable version serves, no deployment row was written
        assert c.get("/v1/models/deployments", headers=auth(admin)).json() == []
        # 1.3.0 (the latest installed when the server started) serves; 1.0.0 fits too
        accepted = deploy("1.0.0")
        assert accepted.status_code == 200, accepted.text
        assert (accepted.json()["stable"], accepted.json()["canary"]) == ("1.3.0", "1.0.0")
