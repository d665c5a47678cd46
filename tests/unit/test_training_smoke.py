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


def test_sample_dice_weighs_a_small_lesion_like_a_large_one() -> None:
    torch = pytest.importorskip("torch")
    from radserve.training.train import dice_ce_loss, sample_dice_ce_loss

    target = torch.zeros(2, 1, 32, 32, dtype=torch.long)
    target[0, 0, 2:30, 2:30] = 1  # a large lesion, found
    target[1, 0, 10:13, 10:13] = 1  # a small lesion, missed
    logits = torch.zeros(2, 2, 32, 32)
    logits[:, 0] = 5.0
    logits[0, 1][target[0, 0] == 1] = 10.0
    target = target[:, 0]
    # Batch Dice barely notices the missed small lesion; per-sample Dice does.
    assert float(dice_ce_loss(logits, target, None)) < 0.1
    assert float(sample_dice_ce_loss(logits, target, None)) > 0.45
    empty = torch.zeros(1, 32, 32, dtype=torch.long)
    assert float(sample_dice_ce_loss(logits[:1] * 0, empty, None)) > 0  # CE only


def test_checkpoint_round_trip_and_loader_workers(tmp_path: Path) -> None:
    """A run with sampling in loader processes saves a checkpoint after each validation;
    loading it gives the same weights (what --from-checkpoint bundles)."""
    torch = pytest.importorskip("torch")
    import argparse
    import dataclasses

    from radserve.training import checkpoint
    from radserve.training.data import SliceSet
    from radserve.training.recipes import RECIPES
    from radserve.training.train import train_model

    base = RECIPES["organs"]
    recipe = dataclasses.replace(
        base,
        train=dataclasses.replace(base.train, channels=(4, 8), patch=32, batch=2, val_every=2),
    )
    rng = np.random.default_rng(0)
    c = recipe.spec.input.in_channels
    images = [rng.normal(size=(c, 40, 48)).astype(np.float16) for _ in range(3)]
    labels = [(img[c // 2] > 1.0).astype(np.uint8) for img in images]
    slices = SliceSet(images, labels, [0, 0, 0])
    args = argparse.Namespace(loader_workers=1, argv=["--model", "organs"])
    path = tmp_path / "ck.pt"
    saved: list[int] = []

    def save(partial) -> None:
        checkpoint.save(partial, path, recipe=recipe, args=args, device="cpu")
        saved.append(partial.steps)

    torch.set_num_threads(1)
    result = train_model(
        recipe, slices, slices, seed=0, steps=4, loader_workers=1, on_validation=save
    )
    assert saved == [2, 4]
    loaded = checkpoint.load(path, recipe)
    assert loaded.best_step == result.best_step and loaded.loader_workers == 1
    for key, value in result.model.state_dict().items():
        assert torch.equal(value, loaded.model.state_dict()[key]), key
    with pytest.raises(ValueError, match="holds organs"):
        checkpoint.load(path, RECIPES["lesions"])
