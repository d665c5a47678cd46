"""Export a trained U-Net to ONNX and prove the file computes what torch computes."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

OPSET = 17
INPUT_NAME = "image"
OUTPUT_NAME = "logits"


def export_onnx(model, path: Path, *, in_channels: int, size: int = 64) -> None:
    """Write ``model`` (BatchNorm folded, eval mode) to ``path``: opset 17, dynamic N, H, W.

    Uses the TorchScript-based exporter (``dynamo=False``): it needs no extra package
    and yields a plain, fully static-weight graph.
    """
    import torch

    from radserve.training.net import fold_batchnorm

    folded = fold_batchnorm(model)
    dummy = torch.zeros(1, in_channels, size, size)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The torch.export-based exporter would need onnxscript; this graph needs neither.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            folded,
            (dummy,),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={
                INPUT_NAME: {0: "batch", 2: "height", 3: "width"},
                OUTPUT_NAME: {0: "batch", 2: "height", 3: "width"},
            },
            do_constant_folding=True,
        )
    import onnx

    onnx.checker.check_model(onnx.load(str(path)))
    logger.info("exported %s (%.1f kB)", path, path.stat().st_size / 1024)


def verify_onnx(model, path: Path, *, in_channels: int, seed: int = 0) -> float:
    """Max |torch - onnxruntime| logits over two batch/shape combinations; raises if large."""
    import onnxruntime as ort
    import torch

    rng = np.random.default_rng(seed)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = model.eval()
    worst = 0.0
    for shape in [(1, in_channels, 96, 128), (3, in_channels, 160, 112)]:
        x = rng.normal(size=shape).astype(np.float32)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        out = session.run(None, {INPUT_NAME: x})[0]
        if out.shape != ref.shape:
            raise RuntimeError(f"ONNX output shape {out.shape} != torch {ref.shape}")
        worst = max(worst, float(np.abs(out - ref).max()))
    scale = 1e-3 * max(1.0, float(np.abs(ref).max()))
    if worst > scale:
        raise RuntimeError(f"ONNX output differs from torch by {worst:.2e} (> {scale:.2e})")
    logger.info("ONNX check %s: max |diff| = %.2e", path.name, worst)
    return worst


def time_onnx(
    path: Path, *, shape: tuple[int, int, int, int], threads: int = 2, repeats: int = 10
) -> float:
    """Median milliseconds per *slice* of onnxruntime CPU inference on an input of ``shape``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    session.run(None, {INPUT_NAME: x})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, {INPUT_NAME: x})
        times.append(time.perf_counter() - t0)
    return 1000.0 * float(np.median(times)) / shape[0]
