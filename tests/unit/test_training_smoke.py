"""Smoke test of the training code: a tiny U-Net trains two steps, exports, and loads.

Skips cleanly where PyTorch (the optional ``[train]`` extra) is not installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def test_importing_training_package_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import radserve.training, radserve.training.recipes, radserve.training.bundle\n"
        "import radserve.training.data, radserve.training.validate\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tiny_unet_trains_exports_and_matches_onnxruntime(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import onnx
    import onnxruntime as ort

    from radserve.training.export import INPUT_NAME, export_onnx, verify_onnx
    from radserve.training.net import UNet2d, UNetConfig
    from radserve.training.train import dice_ce_loss

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = UNet2d(UNetConfig(in_channels=3, num_classes=3, channels=(4, 8)))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x = torch.randn(2, 3, 32, 32)
    y = (x[:, 1] > 0.5).long() + (x[:, 1] > 1.5).long()
    losses = []
    for _ in range(2):
        loss = dice_ce_loss(net(x), y, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses))

    path = tmp_path / "model.onnx"
    export_onnx(net, path, in_channels=3, size=32)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert model.opset_import[0].version >= 17
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)
    assert verify_onnx(net, path, in_channels=3) < 1e-4

    # Dynamic batch and spatial axes: another batch size and shape run too.
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = session.run(None, {INPUT_NAME: np.zeros((5, 3, 48, 16), np.float32)})[0]
    assert out.shape == (5, 3, 48, 16)
