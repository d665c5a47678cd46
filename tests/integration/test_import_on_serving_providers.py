"""``radserve models import`` checks and probes the exported graph on the execution
providers the server serves with (``runtime.providers`` of ``--config`` /
``$RADSERVE_CONFIG``, as :attr:`Catalog.serving_providers` gives them), not on the host's
default. Before 2026-12-07 the import read no settings and ran both on the host's
default (OpenVINO here): a network that OpenVINO cannot compile, which the CPU provider
runs, was refused for a server set to serve on the CPU provider ("the network ... does
not export to an ONNX graph radserve can run" with OpenVINO's reason), and a network
failing only on the configured provider would have been imported.

The network: a TorchScript ``model.ts`` (imported with ``--trust-torchscript``) whose
guard against NaN input is a data-dependent branch, exported as an ONNX ``If`` whose
branches differ in rank; OpenVINO's CPU plugin refuses to compile that."""

from __future__ import annotations

import os
from pathlib import Path

import onnxruntime as ort
import pytest
import yaml
from tests.factories.server_process import run_radserve
from tests.factories.service import settings_for

from radserve.service import Service

pytest.importorskip("monai")
torch = pytest.importorskip("torch")

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
pytestmark = pytest.mark.skipif(
    OPENVINO not in ort.get_available_providers(), reason="needs onnxruntime-openvino"
)
NAME = "tiny-ct-segmentation"  # metadata.json's name, as the import spells it


class _GuardedNet(torch.nn.Module):
    """A 1x1x1 convolution to 3 classes, returned through a branch on NaN input that
    is never taken and whose result has another rank."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(1, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if not bool(torch.isnan(x.max())):
            return y
        return y.amax(dim=1)


def _bundle(folder: Path) -> Path:
    from tests.factories.monai_bundle import write_monai_bundle

    write_monai_bundle(folder)
    (folder / "models" / "model.pt").unlink()
    torch.jit.script(_GuardedNet().eval()).save(str(folder / "models" / "model.ts"))
    return folder


def _config(path: Path, providers: list[str]) -> Path:
    path.write_text(
        yaml.safe_dump({"data_dir": str(path.parent / "data"), "runtime": {"providers": providers}})
    )
    return path


def test_import_runs_its_checks_on_the_configured_providers(tmp_path):
    """``$RADSERVE_CONFIG`` serving on the CPU provider: imported, and served there; with
    ``--config`` serving on OpenVINO, refused with OpenVINO's reason, which names it."""
    bundle = _bundle(tmp_path / "bundle")
    cpu = _config(tmp_path / "cpu.yaml", [CPU])
    done = run_radserve(
        "models", "import", "monai-bundle", str(bundle), "--models-dir", str(tmp_path / "cpu"),
        "--trust-torchscript",
        env={**os.environ, "RADSERVE_CONFIG": str(cpu)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "cpu" / NAME / "1.0.0" / "model.onnx").is_file()
    # a server serving on the CPU provider loads it and runs its warm-up batch
    server = Service(
        settings_for(
            tmp_path / "server",
            runtime__providers=[CPU],
            models__dirs=[str(tmp_path / "cpu")],
        )
    )
    server.catalog.warm_model(NAME, "1.0.0")

    ov = _config(tmp_path / "ov.yaml", [OPENVINO])
    done = run_radserve(
        "models", "import", "monai-bundle", str(bundle), "--models-dir", str(tmp_path / "ov"),
        "--trust-torchscript", "--config", str(ov),
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert (
        f"does not export to an ONNX graph radserve can run on {OPENVINO}, {CPU}, the "
        "providers the server serves with"
    ) in done.stderr
    assert "CPU plug-in doesn't support If operation with dynamic rank" in done.stderr
    assert not (tmp_path / "ov" / NAME).exists()
