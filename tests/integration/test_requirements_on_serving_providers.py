"""A bundle's ``requires:`` is met by the execution providers the server serves with
(``runtime.providers``, :attr:`Catalog.serving_providers`), not by every provider the
host offers. Before 2026-12-07 a server set to ``runtime.providers:
[CPUExecutionProvider]`` on this OpenVINO host installed a bundle requiring OpenVINO
(CLI and ``POST /v1/models``), deployed it, and ``radserve doctor`` passed it, and it
served on the CPU provider; a bundle requiring bf16, which only OpenVINO runs, likewise.
The serving providers are always a subset of the host's (a server start refuses others),
so the old check could only accept too much, never refuse a bundle it could serve."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import httpx
import onnxruntime as ort
import pytest
import yaml
from tests.factories.bundles import write_test_bundles
from tests.factories.server_process import run_radserve
from tests.factories.service import ServerThread, auth, config_file, create_key, settings_for

from radserve.api import create_app
from radserve.errors import BundleRejectedError, DeploymentError
from radserve.lifecycle.requirements import host_facts
from radserve.service import Service

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
pytestmark = pytest.mark.skipif(
    OPENVINO not in ort.get_available_providers(), reason="needs onnxruntime-openvino"
)


def _bundle(root: Path, version: str, requires: dict[str, object]) -> Path:
    """lesions-test (the test threshold bundle) as ``version`` with ``requires``."""
    write_test_bundles(root / "src")
    folder = root / "src" / "lesions-test" / version
    shutil.move(root / "src" / "lesions-test" / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest.update(version=version, requires=requires)
    if "bf16" in requires.get("precision", []):  # type: ignore[operator]
        manifest["files"] = {"fp32": "model.onnx", "bf16": "model.onnx"}
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    return folder


def _zipped(folder: Path) -> bytes:
    """``folder`` (a bundle) as the zip an upload sends: ``<name>/<version>/...``."""
    target = folder.parent / f"{folder.name}.zip"
    with zipfile.ZipFile(target, "w") as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{folder.parent.name}/{folder.name}/{path.relative_to(folder)}")
    return target.read_bytes()


NEEDS_OPENVINO = {"providers": [OPENVINO]}
REFUSAL = (
    f"lesions-test/1.0.1 needs one of the execution providers {OPENVINO}; this server "
    f"serves with {CPU} \\(runtime.providers\\), which leaves out {OPENVINO} that this "
    "host offers: add it to runtime.providers"
)


def test_cli_install_refuses_a_provider_the_configured_server_does_not_serve_with(tmp_path):
    """``radserve models install --config`` of a server serving on the CPU provider:
    refused, naming what the model needs and what the server serves with; the same
    bundle installs for a server serving on OpenVINO."""
    folder = _bundle(tmp_path, "1.0.1", NEEDS_OPENVINO)
    cpu = config_file(
        tmp_path / "cpu", runtime={"providers": [CPU]}, data_dir=str(tmp_path / "cpu" / "data")
    )
    done = run_radserve("models", "install", str(folder), "--config", str(cpu))
    assert done.returncode != 0, done.stdout
    assert "bundle_rejected" in done.stderr
    assert f"needs one of the execution providers {OPENVINO}" in done.stderr
    assert f"this server serves with {CPU} (runtime.providers)" in done.stderr
    assert not (tmp_path / "cpu" / "data" / "models" / "lesions-test" / "1.0.1").exists()
    ov = config_file(
        tmp_path / "ov", runtime={"providers": [OPENVINO]}, data_dir=str(tmp_path / "ov" / "data")
    )
    done = run_radserve("models", "install", str(folder), "--config", str(ov))
    assert done.returncode == 0, done.stderr
    assert "installed lesions-test 1.0.1" in done.stdout
    assert (tmp_path / "ov" / "data" / "models" / "lesions-test" / "1.0.1").is_dir()


def test_rest_install_refuses_it_with_422_naming_both(tmp_path):
    """``POST /v1/models`` to a server serving on the CPU provider: 422
    ``bundle_rejected`` with the same reason."""
    service = Service(settings_for(tmp_path, runtime__providers=[CPU]))
    admin = create_key(service.store, "admin")
    archive = _zipped(_bundle(tmp_path, "1.0.1", NEEDS_OPENVINO))
    with ServerThread(create_app(service)) as server:
        answer = httpx.post(
            f"{server.url}/v1/models", content=archive, headers=auth(admin), timeout=120
        )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "bundle_rejected"
    assert f"this server serves with {CPU} (runtime.providers)" in error["message"]
    assert f"needs one of the execution providers {OPENVINO}" in error["message"]


def test_deploy_and_doctor_refuse_a_hand_copied_one(tmp_path):
    """The bundle copied into ``models.dirs`` by hand (never installed): its deploy is
    refused with the same reason, and ``radserve doctor`` fails it (blocking where the
    default pipeline serves it)."""
    cfg = config_file(tmp_path, runtime={"providers": [CPU]}, data_dir=str(tmp_path / "data"))
    models = Path(yaml.safe_load(cfg.read_text())["models"]["dirs"][0])
    shutil.copytree(_bundle(tmp_path, "1.0.1", NEEDS_OPENVINO), models / "lesions-test" / "1.0.1")
    service = Service(settings_for(tmp_path, runtime__providers=[CPU]))
    assert service.catalog.serving_providers == (CPU,)
    with pytest.raises(DeploymentError, match=REFUSAL):
        service.lifecycle.deploy("lesions-test", "1.0.1", actor="test", reason="test")
    done = run_radserve("doctor", "--json", "--no-ports", "--config", str(cfg))
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    check = checks["model lesions-test 1.0.1"]
    assert check["status"] != "ok", check
    assert f"this server serves with {CPU} (runtime.providers)" in check["detail"]


@pytest.mark.skipif(not host_facts().runs_bf16, reason="needs OpenVINO on a CPU with bf16")
def test_a_bf16_requirement_needs_openvino_first_among_the_serving_providers(tmp_path):
    """``requires.precision: [bf16]``: this host runs bf16 (OpenVINO, AVX-512 BF16 or
    AMX), a server serving on the CPU provider does not; refused there, installed where
    OpenVINO serves."""
    folder = _bundle(tmp_path, "1.0.1", {"precision": ["bf16"]})
    cpu = Service(settings_for(tmp_path / "cpu", runtime__providers=[CPU]))
    with pytest.raises(
        BundleRejectedError,
        match=f"needs bf16, which runs on OpenVINO's CPU plugin only; this server serves "
        f"with {CPU} \\(runtime.providers\\)",
    ):
        cpu.lifecycle.install(folder, actor="test")
    ov = Service(settings_for(tmp_path / "ov", runtime__providers=[OPENVINO, CPU]))
    assert ov.lifecycle.install(folder, actor="test").version == "1.0.1"
