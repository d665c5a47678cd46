"""``radserve models install BUNDLE.zip`` says, per gated precision, whether THIS host can
serve it, by the rule ``models list`` shows: before, it printed gate.json's raw verdicts
(``bf16: accepted``) on an AVX2 host where ``models list`` and ``run --precision bf16``
refuse bf16 and the AMX-gated int8."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import yaml
from tests.factories.server_process import run_radserve

from radserve.models.registry import bundled_model_dir


def _bundle_zip(tmp_path: Path) -> Path:
    """The shipped organs model (fp16, int8 and bf16 gated through OpenVINO on an AMX
    CPU) as version 1.0.1, zipped."""
    folder = tmp_path / "src" / "organs" / "1.0.1"
    shutil.copytree(bundled_model_dir() / "organs" / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["version"] = "1.0.1"
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    target = tmp_path / "organs-1.0.1.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"organs/1.0.1/{path.relative_to(folder).as_posix()}")
    return target


def test_install_says_which_gated_precisions_this_host_serves_as_models_list_does(
    tmp_path: Path,
) -> None:
    """Installed with --trust-gate: the gate.json in the zip is the site's own (without
    it the gate is set aside: the next test)."""
    data = str(tmp_path / "data")
    bundle = str(_bundle_zip(tmp_path))
    done = run_radserve("models", "install", bundle, "--trust-gate", "--data-dir", data)
    assert done.returncode == 0, done.stderr
    lines = {
        line.strip().partition(":")[0]: line.strip().partition(": ")[2]
        for line in done.stdout.splitlines()[1:]
    }
    assert set(lines) == {"fp16", "int8", "bf16"}, done.stdout
    listed = run_radserve("models", "list", "--json", "--data-dir", data)
    assert listed.returncode == 0, listed.stderr
    row = next(
        r for r in json.loads(listed.stdout) if (r["name"], r["version"]) == ("organs", "1.0.1")
    )
    for precision, said in lines.items():
        assert said.startswith("accepted by its gate; "), said  # the gate's verdict stays
        if precision in row["servable"]:
            assert said.endswith("; servable here"), said
        else:  # on an AVX2 host: int8 and bf16, each with the reason models list gives
            assert said.endswith(f"; not servable here: {row['gate'][precision]}"), said


def test_install_says_a_shipped_gate_is_not_trusted_and_list_gives_the_reason(
    tmp_path: Path,
) -> None:
    """Without --trust-gate the gate.json that came in the zip serves nothing: install
    says so per declared variant, and ``models list`` gives the same reason."""
    data = str(tmp_path / "data")
    done = run_radserve("models", "install", str(_bundle_zip(tmp_path)), "--data-dir", data)
    assert done.returncode == 0, done.stderr
    assert "the bundle's gate.json was measured elsewhere and is not trusted" in done.stdout
    listed = run_radserve("models", "list", "--json", "--data-dir", data)
    assert listed.returncode == 0, listed.stderr
    row = next(
        r for r in json.loads(listed.stdout) if (r["name"], r["version"]) == ("organs", "1.0.1")
    )
    assert row["servable"] == ["fp32"]
    for precision in ("fp16", "int8", "bf16"):
        why = row["gate"][precision]
        assert "the gate.json that came with the bundle is not trusted" in why, why
        assert f"  {precision}: not servable: {why}" in done.stdout
