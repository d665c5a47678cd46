"""A deployed version serves only as it was installed. Deploy and promote refused a
version whose files changed since install; a rollback to the previous stable version and
a server start (which loads what the deployments name) did not look: a model.onnx
replaced in the store after install served every study under the version the deployment
and its audit record name (a probe's replaced lesion model found the whole liver as one
lesion). Now the rollback is refused (409 ``deployment_invalid``) and a restarted server
does not apply the deployment (logged; the step keeps what it served before), as for a
version that does not load."""

from __future__ import annotations

import logging
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories.onnx_models import threshold_model
from tests.factories.service import auth, config_file, live_server, make_study, upload, wait_job

from radserve.config import load_settings

STEP = "lesions-test"


def _bundle(root: Path, shipped: Path, version: str) -> bytes:
    """The shipped test lesion bundle as ``version``, zipped for ``POST /v1/models``."""
    folder = root / STEP / version
    shutil.copytree(shipped / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": version}))
    target = root / f"{version}.zip"
    with zipfile.ZipFile(target, "w") as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{STEP}/{version}/{path.relative_to(folder).as_posix()}")
    return target.read_bytes()


def _replace_model(data: Path, version: str) -> None:
    """What an edit in the store does: a lesion model labelling everything above 50 HU."""
    threshold_model(data / "models" / STEP / version / "model.onnx", in_channels=3, level=0.05)


def _deploy(live: dict[str, Any], version: str) -> Any:
    body = {"version": version, "role": "stable", "reason": "test"}
    return live["client"].post(f"/v1/models/{STEP}/deploy", json=body, headers=auth(live["admin"]))


def _install(live: dict[str, Any], zipped: bytes) -> None:
    answer = live["client"].post("/v1/models", content=zipped, headers=auth(live["admin"]))
    assert answer.status_code == 201, answer.text


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Any, Path, dict[str, bytes]]:
    config = config_file(tmp_path, lifecycle={"poll_s": 0.2})
    shipped = tmp_path / "assets" / "models"
    bundles = {v: _bundle(tmp_path / "bundles", shipped, v) for v in ("1.1.0", "1.2.0")}
    return load_settings(config, data_dir=tmp_path / "data"), tmp_path, bundles


def test_a_rollback_to_a_version_changed_since_install_is_refused(setup) -> None:
    settings, _, bundles = setup
    with live_server(settings, roles=("admin", "submit")) as live:
        for zipped in bundles.values():
            _install(live, zipped)
        assert _deploy(live, "1.1.0").status_code == 200
        assert _deploy(live, "1.2.0").status_code == 200
        _replace_model(settings.data_dir, "1.1.0")
        back = live["client"].post(
            f"/v1/models/{STEP}/rollback", json={"reason": "test"}, headers=auth(live["admin"])
        )
        assert back.status_code == 409, back.text
        error = back.json()["error"]
        assert error["code"] == "deployment_invalid"
        assert "1.1.0 changed since it was installed: model.onnx changed" in error["message"]
        assert live["service"].lifecycle.active()[STEP].stable == "1.2.0"
        # a version gone from the store is refused by name too
        shutil.rmtree(settings.data_dir / "models" / STEP / "1.1.0")
        back = live["client"].post(
            f"/v1/models/{STEP}/rollback", json={"reason": "test"}, headers=auth(live["admin"])
        )
        assert back.status_code == 409
        assert "cannot go back to 1.1.0" in back.json()["error"]["message"]


def test_a_restart_does_not_serve_a_deployed_version_changed_since_install(
    setup, caplog: pytest.LogCaptureFixture
) -> None:
    settings, tmp_path, bundles = setup
    with live_server(settings, roles=("admin",)) as live:
        _install(live, bundles["1.1.0"])
        assert _deploy(live, "1.1.0").status_code == 200
    _replace_model(settings.data_dir, "1.1.0")
    caplog.set_level(logging.ERROR, logger="radserve.service.lifecycle")
    with live_server(settings, roles=("submit",)) as live:
        assert STEP not in live["service"].lifecycle.active()
        assert any(
            "not applied" in r.getMessage() and "changed since it was installed" in r.getMessage()
            for r in caplog.records
        )
        sent = live["client"].post(
            "/v1/studies",
            files=upload(make_study(tmp_path / "study")),
            headers=auth(live["submit"]),
        )
        assert sent.status_code == 202, sent.text
        job = wait_job(live["client"], sent.json()["id"], live["submit"])
        assert job["state"] == "succeeded", job
        assert job["model_versions"][STEP] == "1.0.0"  # what served before the deployment
        # and /readyz says so (the deployments table names 1.1.0): degraded, with why
        ready = live["client"].get("/readyz", headers=auth(live["submit"])).json()
        assert ready["degraded"] is True, ready
        assert any(
            STEP in r and "not applied" in r and "changed since it was installed" in r
            for r in ready["reasons"]
        ), ready
