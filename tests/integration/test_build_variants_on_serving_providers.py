"""``radserve models build-variants`` builds, evaluates and times the variants on the
providers the server of ``--config`` (default ``$RADSERVE_CONFIG``) serves with, as
``models install --build-variants`` does; and ``radserve models list`` says whether bf16
may serve by those providers, by the rule a ``requires.precision: [bf16]`` is judged by.

Before 2026-12-07 the standalone command had no ``--config`` and took the host's default
(OpenVINO here) whatever ``runtime.providers`` said: a server serving on the CPU provider
got its int8 and fp16 gated through OpenVINO's kernels and, on this AVX-512 BF16 host, a
bf16 variant it cannot serve; and ``models list`` called such a bf16 "servable" (the
registry judged bf16 by the CPU alone) while that server's deploy refused it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnxruntime as ort
import pytest
import yaml
from tests.factories.bundles import one_step_pipeline
from tests.factories.server_process import run_radserve
from tests.factories.service import config_file

from radserve.lifecycle.requirements import host_facts

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
STEP = "organs-test"
SMALL = ("--small", "--seeds", "0-1", "--calibration-seeds", "1000")
pytestmark = pytest.mark.skipif(
    OPENVINO not in ort.get_available_providers(), reason="needs onnxruntime-openvino"
)


def _servers(tmp: Path) -> tuple[Path, Path]:
    """Two configs on one data dir and one set of test models: serving on the CPU
    provider, and on OpenVINO first."""
    cpu = config_file(tmp, runtime={"providers": [CPU]}, data_dir=str(tmp / "data"))
    settings = yaml.safe_load(cpu.read_text())
    settings["runtime"]["providers"] = [OPENVINO, CPU]
    ov = tmp / "openvino.yaml"
    ov.write_text(yaml.safe_dump(settings))
    return cpu, ov


def _build(tmp: Path, *args: str, env: dict[str, str] | None = None) -> object:
    """``models build-variants`` of organs-test in the test models' folder, through a
    one-step pipeline."""
    pipeline = one_step_pipeline(tmp, STEP)
    return run_radserve(
        "models", "build-variants", "--model", STEP, "--models-dir",
        str(tmp / "assets" / "models"), "--pipeline", str(pipeline), *SMALL, *args, env=env,
    )  # fmt: skip


def test_build_variants_gates_on_the_providers_of_radserve_config(tmp_path):
    """``$RADSERVE_CONFIG`` names a server serving on the CPU provider: the variants are
    evaluated and timed there (gate.json says so, fp32 too), and without ``--precision``
    bf16, which that server cannot serve, is not built, whatever this host could do."""
    cpu, _ = _servers(tmp_path)
    built = _build(tmp_path, env={**os.environ, "RADSERVE_CONFIG": str(cpu)})
    assert built.returncode == 0, built.stderr
    gate = json.loads((tmp_path / "assets" / "models" / STEP / "1.0.0" / "gate.json").read_text())
    assert gate["fp32_speed"]["provider"] == CPU
    assert set(gate["variants"]) == {"fp16", "int8"}
    for precision, record in gate["variants"].items():
        assert record["providers"] == [CPU], precision
        assert record["speed"]["provider"] == CPU, precision


def test_bf16_asked_of_a_server_not_serving_on_openvino_is_refused_before_building(tmp_path):
    """``--precision bf16 --config`` of the CPU-provider server: refused, naming the
    serving providers and how to serve bf16; nothing is written."""
    cpu, _ = _servers(tmp_path)
    built = _build(tmp_path, "--precision", "fp16,bf16", "--config", str(cpu))
    assert built.returncode != 0, built.stdout
    said = " ".join(built.stderr.split())
    assert (
        f"bf16 runs on OpenVINO's CPU plugin only, and this server serves with {CPU} "
        "(runtime.providers)"
    ) in said
    assert f"put {OPENVINO} first in runtime.providers" in said
    bundle = tmp_path / "assets" / "models" / STEP / "1.0.0"
    assert not (bundle / "gate.json").exists() and not (bundle / "model.fp16.onnx").exists()


def _row(config: Path) -> dict[str, object]:
    done = run_radserve("models", "list", "--json", "--config", str(config))
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    return next(r for r in rows if r["name"] == STEP and r["version"] == "1.0.0")


@pytest.mark.skipif(not host_facts().runs_bf16, reason="needs OpenVINO on a CPU with bf16")
def test_models_list_says_bf16_servable_only_where_the_server_serves_on_openvino(tmp_path):
    """A bf16 variant gated (and accepted) on OpenVINO: ``models list`` of the server
    serving on OpenVINO lists it servable; of the server serving on the CPU provider, on
    the same host and files, not, with the reason ``requires.precision: [bf16]`` gives."""
    cpu, ov = _servers(tmp_path)
    built = _build(tmp_path, "--precision", "bf16", "--config", str(ov))
    assert built.returncode == 0, built.stderr
    on_openvino = _row(ov)
    assert on_openvino["gate"]["bf16"] == "accepted", on_openvino["gate"]
    assert "bf16" in on_openvino["servable"]

    on_cpu = _row(cpu)
    assert on_cpu["servable"] == ["fp32"]
    reason = " ".join(on_cpu["gate"]["bf16"].split())
    assert reason.startswith(f"{STEP}/1.0.0 bf16 may not serve here: bf16 runs on OpenVINO's")
    assert f"this server serves with {CPU} (runtime.providers)" in reason
    assert f"put {OPENVINO} first in runtime.providers to serve it" in reason


@pytest.mark.skipif(not host_facts().runs_bf16, reason="needs OpenVINO on a CPU with bf16")
def test_radserve_run_judges_bf16_on_the_providers_it_runs_on(tmp_path):
    """``radserve run --precision bf16`` with the CPU-provider config, the bf16 variant
    gated and accepted on OpenVINO: refused before any work with the reason the server's
    ``models list`` gives, naming ``runtime.providers``. Until 2026-12-07 its registry
    judged bf16 by the CPU alone: the variant was chosen, the study read, and the run
    failed when its session was made, saying to install onnxruntime-openvino (installed)."""
    cpu, ov = _servers(tmp_path)
    built = _build(tmp_path, "--precision", "bf16", "--config", str(ov))
    assert built.returncode == 0, built.stderr
    made = run_radserve("phantom", "--small", "--seed", "0", "--out", str(tmp_path / "ct"))
    assert made.returncode == 0, made.stderr
    ran = run_radserve(
        "run", str(tmp_path / "ct" / "dicom"), "--out", str(tmp_path / "out"),
        "--config", str(cpu), "--precision", "bf16",
        "--models-dir", str(tmp_path / "assets" / "models"),
        "--pipeline", str(one_step_pipeline(tmp_path, STEP)),
    )  # fmt: skip
    assert ran.returncode != 0, ran.stdout
    said = " ".join((ran.stdout + ran.stderr).split())
    assert f"{STEP}/1.0.0 bf16 may not serve here: bf16 runs on OpenVINO's" in said
    assert f"this server serves with {CPU} (runtime.providers)" in said
