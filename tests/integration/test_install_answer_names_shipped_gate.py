"""An install's answer says what became of a gate.json that came in the bundle. Since
2026-12-06 it is set aside (``gate.shipped.json``) unless the installer vouches for it,
so the bundle's reduced-precision variants do not serve until gated here; before
2026-12-07 only ``GET /v1/models`` said so: the 201 of ``POST /v1/models`` and the
``radserve models installs`` table (installs the server built after answering) did not,
and a vendor reading them took its variants for served."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import yaml
from tests.factories.server_process import run_radserve
from tests.factories.service import auth, config_file, live_server

from radserve.config import load_settings
from radserve.lifecycle.install import install_bundle
from radserve.lifecycle.install_tasks import InstallTasks
from radserve.models.registry import bundled_model_dir
from radserve.service.variant_install import install_summary

STEP = "lesions-test"
# a vendor's gate report (one radserve reads: the shipped organs model's)
VENDOR_GATE = (bundled_model_dir() / "organs" / "1.0.0" / "gate.json").read_text()


def _bundle(root: Path, shipped: Path, version: str, *, gate: str | None) -> Path:
    """The test lesion bundle as ``version``, with ``gate`` as its gate.json."""
    folder = root / STEP / version
    shutil.copytree(shipped / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": version}))
    if gate is not None:
        (folder / "gate.json").write_text(gate)
    return folder


def _zipped(folder: Path) -> bytes:
    target = folder.parent / f"{folder.name}.zip"
    with zipfile.ZipFile(target, "w") as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{STEP}/{folder.name}/{path.relative_to(folder).as_posix()}")
    return target.read_bytes()


def test_the_201_answer_says_a_shipped_gate_was_set_aside_or_trusted(tmp_path):
    settings = load_settings(config_file(tmp_path), data_dir=tmp_path / "data")
    shipped = tmp_path / "assets" / "models"
    bundles = {
        "1.1.0": _bundle(tmp_path / "b", shipped, "1.1.0", gate=VENDOR_GATE),
        "1.2.0": _bundle(tmp_path / "b", shipped, "1.2.0", gate=VENDOR_GATE),
        "1.3.0": _bundle(tmp_path / "b", shipped, "1.3.0", gate=None),
    }
    with live_server(settings, roles=("admin",), warm=False) as live:
        client, admin = live["client"], auth(live["admin"])
        answers = {
            version: client.post(
                "/v1/models",
                params={"trust_gate": "true"} if version == "1.2.0" else None,
                content=_zipped(folder),
                headers=admin,
            )
            for version, folder in bundles.items()
        }
        schema = client.get("/openapi.json", headers=admin).json()
        listed = client.get("/v1/models", headers=admin).json()["versions"]
    assert all(a.status_code == 201 for a in answers.values()), {
        v: a.text for v, a in answers.items()
    }
    said = {version: answer.json()["shipped_gate"] for version, answer in answers.items()}
    assert said == {"1.1.0": "set_aside", "1.2.0": "trusted", "1.3.0": None}
    field = schema["components"]["schemas"]["InstallOut"]["properties"]["shipped_gate"]
    assert "do not serve until gated on this site" in field["description"]
    set_aside = next(v for v in listed if (v["name"], v["version"]) == (STEP, "1.1.0"))
    assert set_aside["servable"] == ["fp32"]  # what the 201's set_aside announced


def test_a_trusted_gate_radserve_cannot_read_is_refused_before_it_installs(tmp_path):
    """Before 2026-12-07 it was installed, the answer was 503 ``model_invalid`` (reading
    the gate for the answer failed) and sending it again 409: installed already."""
    settings = load_settings(config_file(tmp_path), data_dir=tmp_path / "data")
    shipped = tmp_path / "assets" / "models"
    folder = _bundle(tmp_path / "b", shipped, "1.1.0", gate=json.dumps({"model": STEP}))
    with live_server(settings, roles=("admin",), warm=False) as live:
        client, admin = live["client"], auth(live["admin"])
        refused = client.post(
            "/v1/models", params={"trust_gate": "true"}, content=_zipped(folder), headers=admin
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "bundle_rejected"
        assert "its gate.json, trusted at install, is not a gate report" in error["message"]
        assert not (settings.data_dir / "models" / STEP / "1.1.0").exists()
        again = client.post("/v1/models", content=_zipped(folder), headers=admin)
        assert again.status_code == 201, again.text
        assert again.json()["shipped_gate"] == "set_aside"


def test_models_installs_says_a_shipped_gate_was_set_aside(tmp_path):
    """An install the server built after answering: its record's result, read by
    ``radserve models installs``, as the server's install queue writes it."""
    shipped = tmp_path / "assets" / "models"
    config = config_file(tmp_path)
    data = tmp_path / "data"
    folder = _bundle(tmp_path / "b", shipped, "1.1.0", gate=VENDOR_GATE)
    tasks = InstallTasks(data)
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept)
    task = tasks.create(kept, "HTTP upload (1 bytes)", actor="key", precisions=None)
    installed = install_bundle(folder, data)
    tasks.installed(tasks.started(task), install_summary(installed))

    wide = {**os.environ, "COLUMNS": "400"}  # the table in one line per install
    listed = run_radserve(
        "models", "installs", "--config", str(config), "--data-dir", str(data), env=wide
    )
    assert listed.returncode == 0, listed.stderr
    assert (
        "lesions-test 1.1.0; the bundle's gate.json was measured elsewhere and is not "
        "trusted (kept as gate.shipped.json)" in listed.stdout
    ), listed.stdout
    as_json = run_radserve(
        "models", "installs", "--json", "--config", str(config), "--data-dir", str(data)
    )
    assert json.loads(as_json.stdout)[0]["result"]["shipped_gate"] == "set_aside"
