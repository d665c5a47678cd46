"""nnU-Net's sliding window replayed from its own patch logits, accumulated in float32.

``nnUNetPredictor`` sums Gaussian-weighted patch logits into a float16 array (and the
weights into another, from a float16 Gaussian scaled to a maximum of 10) and divides
one by the other. Where only patch corners reach a voxel (the grid's edges and
corners: weights below float16's normal range, 6e-5) both sums keep a few bits, so a
voxel whose two best classes are close gets either. radserve sums in float32. To tell
nnU-Net's rounding from radserve's own, the benchmark records the network's output for
every patch while nnU-Net runs (to a file, so neither memory figure holds them), then
runs nnU-Net's sliding window once more with those outputs and float32 sums
(:func:`float32_accumulation`) -- no second network pass.
"""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["PatchLogits", "float32_accumulation"]


class PatchLogits(torch.nn.Module):
    """Wraps nnU-Net's network: ``record`` appends each output to ``path``;
    ``replay`` returns the recorded outputs in order instead of running the network."""

    def __init__(self, network: torch.nn.Module, path: Path) -> None:
        super().__init__()
        self.network = network
        self.path = Path(path)
        self.mode = "record"
        self._shapes: list[tuple[int, ...]] = []
        self._offset = 0
        self.network_s = 0.0  # seconds in the network while recording
        self.path.write_bytes(b"")

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:  # nnU-Net loads each fold
        return self.network.load_state_dict(*args, **kwargs)

    def replay(self) -> None:
        self.mode, self._offset = "replay", 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "record":
            t0 = time.perf_counter()
            out = self.network(x)
            if out.is_cuda:  # kernels run asynchronously: the time is theirs once synced
                torch.cuda.synchronize(out.device)
            self.network_s += time.perf_counter() - t0
            array = out.detach().float().cpu().numpy()
            with self.path.open("ab") as f:
                f.write(array.tobytes())
            self._shapes.append(tuple(array.shape))
            return out
        shape = self._shapes.pop(0)
        n = int(np.prod(shape))
        array = np.fromfile(self.path, np.float32, count=n, offset=self._offset).reshape(shape)
        self._offset += 4 * n
        return torch.from_numpy(array)


@torch.inference_mode()
def _sliding_window_float32(
    self: Any, data: torch.Tensor, slicers: list, do_on_device: bool = True
) -> torch.Tensor:
    """``nnUNetPredictor._internal_predict_sliding_window_return_logits`` with float32
    sums and a float32 Gaussian (same scale, 10), on the CPU, without its queue thread."""
    from nnunetv2.inference.sliding_window_prediction import compute_gaussian

    cpu = torch.device("cpu")
    heads = self.label_manager.num_segmentation_heads
    logits = torch.zeros((heads, *data.shape[1:]), dtype=torch.float32)
    weights = torch.zeros(data.shape[1:], dtype=torch.float32)
    gaussian = compute_gaussian(
        tuple(self.configuration_manager.patch_size), 1.0 / 8, 10, dtype=torch.float32, device=cpu
    )
    for sl in slicers:
        out = self._internal_maybe_mirror_and_predict(data[sl][None])[0].float()
        logits[sl] += out * gaussian
        weights[sl[1:]] += gaussian
    return logits / weights


def float32_accumulation(predictor: Any) -> None:
    """Make ``predictor`` (an ``nnUNetPredictor``) sum patch logits in float32."""
    predictor._internal_predict_sliding_window_return_logits = types.MethodType(
        _sliding_window_float32, predictor
    )
