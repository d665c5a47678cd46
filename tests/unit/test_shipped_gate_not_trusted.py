"""A ``gate.json`` inside a bundle is a vendor's evidence, measured on its data and CPU,
not on this site's held-out phantoms. Before 2026-12-06 a bundle installed without
``--build-variants`` served its reduced-precision variants on it. Now install sets it
aside (``gate.shipped.json``) and no variant serves until it is gated here, unless the
installer vouches for it (``--trust-gate``: a gate the site built before installing)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from tests.factories.host import CPU_HOST

from radserve.lifecycle.install import install_bundle, read_install, verify_install
from radserve.models.registry import ModelRegistry, bundled_model_dir

HOST = CPU_HOST


@pytest.fixture
def gated_bundle(tmp_path: Path) -> Path:
    """The shipped organs model with its gate.json (fp16, int8, bf16 accepted), as 1.0.1."""
    folder = tmp_path / "src" / "organs" / "1.0.1"
    shutil.copytree(bundled_model_dir() / "organs" / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": "1.0.1"}))
    gate = json.loads((folder / "gate.json").read_text())
    assert all(v["accepted"] for v in gate["variants"].values())
    return folder


def test_a_gate_shipped_in_the_bundle_serves_no_variant(gated_bundle, tmp_path):
    installed = install_bundle(gated_bundle, tmp_path / "data", host=HOST)
    directory = installed.directory
    assert not (directory / "gate.json").exists()
    assert (directory / "gate.shipped.json").is_file()
    assert read_install(directory).shipped_gate == "set_aside"
    assert verify_install(directory) == []
    bundle = ModelRegistry([tmp_path / "data" / "models"]).get("organs", "1.0.1")
    assert bundle.available_precisions() == ["fp32"]
    for precision in ("fp16", "int8", "bf16"):
        why = bundle.rejection(precision)
        assert why is not None and "the gate.json that came with the bundle is not trusted" in why
        assert "--build-variants" in why


def test_a_gate_the_installer_vouches_for_is_read(gated_bundle, tmp_path):
    installed = install_bundle(gated_bundle, tmp_path / "data", host=HOST, trust_shipped_gate=True)
    assert (installed.directory / "gate.json").is_file()
    assert read_install(installed.directory).shipped_gate == "trusted"
    bundle = ModelRegistry([tmp_path / "data" / "models"]).get("organs", "1.0.1")
    assert bundle.gate_report() is not None
    for precision in ("fp16", "int8", "bf16"):
        assert "not trusted" not in (bundle.rejection(precision) or "")


def test_a_bundle_without_a_gate_installs_as_before(tmp_path):
    folder = tmp_path / "src" / "organs" / "1.0.1"
    shutil.copytree(bundled_model_dir() / "organs" / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "version": "1.0.1"}))
    (folder / "gate.json").unlink()
    installed = install_bundle(folder, tmp_path / "data", host=HOST)
    assert read_install(installed.directory).shipped_gate is None
    bundle = ModelRegistry([tmp_path / "data" / "models"]).get("organs", "1.0.1")
    assert "gate.json is missing" in (bundle.rejection("fp16") or "")
