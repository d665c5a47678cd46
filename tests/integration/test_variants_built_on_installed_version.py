"""``radserve models build-variants`` run on an installed version (``--models-dir
<data_dir>/models``) records what it wrote (the variant files, model.yaml's ``files:``
block, gate.json) in the version's install.json. Before 2026-12-07 the version then
read "changed since install" (model.yaml changed; gate.json, model.fp16.onnx and
model.int8.onnx added): its deploy was refused, ``radserve doctor`` flagged it, and
warm-up probed its variants again in a separate process with a warning. A change made
any other way, before or after the build, is still detected."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml
from tests.factories.bundles import one_step_pipeline
from tests.factories.server_process import run_radserve
from tests.factories.service import settings_for

from radserve.errors import DeploymentError
from radserve.lifecycle.install import verify_install
from radserve.service import Service

STEP = "organs-test"
BUILD = ("--small", "--seeds", "0-1", "--calibration-seeds", "1000", "--precision", "fp16,int8")


def _build_variants(tmp_path: Path, models: Path) -> object:
    """``radserve models build-variants`` of organs-test through a one-step pipeline."""
    pipeline = one_step_pipeline(tmp_path, STEP)
    return run_radserve(
        "models", "build-variants", "--model", STEP, "--models-dir", str(models),
        "--pipeline", str(pipeline), *BUILD,
    )  # fmt: skip


@pytest.fixture
def installed(tmp_path: Path) -> tuple[Service, Path]:
    """A server and organs-test installed as 1.0.1 (fp32 only)."""
    server = Service(settings_for(tmp_path))
    folder = tmp_path / "src" / STEP / "1.0.1"
    shutil.copytree(tmp_path / "assets" / "models" / STEP / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": "1.0.1"}))
    directory = server.lifecycle.install(folder, actor="test").directory
    return server, directory


def test_variants_built_on_an_installed_version_are_recorded_and_deploy(
    installed, tmp_path, caplog
):
    server, directory = installed
    built = _build_variants(tmp_path, directory.parent.parent)
    assert built.returncode == 0, built.stderr
    assert verify_install(directory) == []
    record = json.loads((directory / "install.json").read_text())
    change = record["changes"][-1]
    assert set(change["files"]) == {"model.yaml", "model.fp16.onnx", "model.int8.onnx", "gate.json"}
    assert "build-variants: fp16, int8 built and gated" in change["what"]
    server.lifecycle.check_servable(STEP, "1.0.1")  # deployable, as installed
    with caplog.at_level(logging.INFO, logger="radserve.service.catalog"):
        server.catalog.warm_model(STEP, "1.0.1", "fp16")
    assert "probing it in a separate process" not in caplog.text

    # a hand edit afterwards is a change since install
    with open(directory / "model.yaml", "a") as fh:
        fh.write("# edited by hand\n")
    assert verify_install(directory) == ["model.yaml changed since install"]
    with pytest.raises(DeploymentError, match=r"changed since it was installed: model\.yaml"):
        server.lifecycle.check_servable(STEP, "1.0.1")


def test_a_build_on_a_version_changed_since_install_is_refused_and_records_nothing(
    installed, tmp_path
):
    """The build records model.yaml as installed: on a version edited by hand it would
    have taken the edit for its own."""
    _, directory = installed
    with open(directory / "model.yaml", "a") as fh:
        fh.write("# edited by hand\n")
    before = (directory / "install.json").read_bytes()
    built = _build_variants(tmp_path, directory.parent.parent)
    assert built.returncode != 0
    said = " ".join(built.stderr.split())
    assert "organs-test/1.0.1 changed since it was installed (model.yaml changed" in said
    assert (directory / "install.json").read_bytes() == before
    assert not (directory / "model.fp16.onnx").exists()
    assert verify_install(directory) == ["model.yaml changed since install"]
