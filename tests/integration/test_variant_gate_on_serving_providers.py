"""``radserve models install --build-variants`` (and ``POST /v1/models?build_variants``,
the same prepare step) chooses, evaluates and times the variants on the execution
providers the server serves with (``runtime.providers``, :attr:`Catalog.serving_providers`).
Before 2026-12-07 it took the host's default (OpenVINO here) whatever the server was set
to: a server serving on the CPU provider got int8 and fp16 gated through OpenVINO's
kernels (gate.json said so, and served them through the CPU provider's, which the gate
never measured), and on this AVX-512 BF16 host a bf16 variant was built, gated and
reported "servable here", though the CPU provider cannot run bf16 at all."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest
from tests.factories.server_process import run_radserve
from tests.factories.service import config_file
from tests.integration.test_install_variants import VARIANTS, candidate

from radserve.lifecycle.requirements import host_facts

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
pytestmark = pytest.mark.skipif(
    OPENVINO not in ort.get_available_providers(), reason="needs onnxruntime-openvino"
)


def _cpu_server(tmp: Path) -> tuple[Path, Path]:
    """A config serving on the CPU provider, and a candidate organs-test 1.0.1."""
    cfg = config_file(
        tmp,
        lifecycle={"variants": VARIANTS},
        runtime={"providers": [CPU]},
        data_dir=str(tmp / "data"),
    )
    folder = candidate(tmp / "src", tmp / "assets" / "models", "1.0.1", fp16_fragile=False)
    return cfg, folder


def test_variants_are_gated_on_the_providers_the_server_serves_with(tmp_path):
    """The gate's evaluation and timing run on the CPU provider, and gate.json records
    it for fp32 and every variant; without ``--precision``, bf16 (which this server
    cannot serve) is not built, whatever the host's OpenVINO could do."""
    cfg, folder = _cpu_server(tmp_path)
    done = run_radserve("models", "install", str(folder), "--build-variants", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert "installed organs-test 1.0.1" in done.stdout
    assert "bf16" not in done.stdout
    installed = tmp_path / "data" / "models" / "organs-test" / "1.0.1"
    gate = json.loads((installed / "gate.json").read_text())
    assert gate["fp32_speed"]["provider"] == CPU
    assert set(gate["variants"]) == {"fp16", "int8"}
    for precision, record in gate["variants"].items():
        assert record["providers"] == [CPU], precision
        assert record["speed"]["provider"] == CPU, precision


@pytest.mark.skipif(not host_facts().runs_bf16, reason="needs OpenVINO on a CPU with bf16")
def test_bf16_asked_of_a_server_not_serving_on_openvino_is_refused_naming_its_providers(
    tmp_path,
):
    """``--precision fp16,bf16`` on the CPU-provider server: refused before anything is
    built, naming the serving providers and how to serve bf16; nothing is installed."""
    cfg, folder = _cpu_server(tmp_path)
    done = run_radserve(
        "models", "install", str(folder), "--build-variants", "--precision", "fp16,bf16",
        "--config", str(cfg),
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "bundle_rejected" in done.stderr
    assert (
        f"bf16 runs on OpenVINO's CPU plugin only, and this server serves with {CPU} "
        "(runtime.providers)"
    ) in done.stderr
    assert f"put {OPENVINO} first in runtime.providers" in done.stderr
    assert not (tmp_path / "data" / "models" / "organs-test" / "1.0.1").exists()
