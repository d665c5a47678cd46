"""What the agreement tests compare on: a synthetic CT with every intensity class, the
labels radserve gives for an imported bundle on it (in process, ONNX Runtime), and the
fraction of voxels two label maps agree on. Shared by the nnU-Net and MONAI agreement,
import and serve tests (and the measurement tools)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from radserve.domain.volume import Volume
from radserve.inference import ModelSession, make_task, run_task
from radserve.models.manifest import load_manifest


def synthetic_ct(shape: tuple[int, int, int], seed: int = 1) -> np.ndarray:
    """Air, a body ellipse of soft tissue with two brighter blobs and a bone, noise, and a
    zero-valued frame (outside the scanner's field of view) for crop-to-non-zero."""
    rng = np.random.default_rng(seed)
    z, y, x = np.ogrid[: shape[0], : shape[1], : shape[2]]
    cz, cy, cx = (s / 2 for s in shape)
    ct = np.full(shape, -1000.0, np.float32)
    body = ((y - cy) / (0.4 * shape[1])) ** 2 + ((x - cx) / (0.45 * shape[2])) ** 2 < 1
    ct[np.broadcast_to(body, shape)] = 40.0
    blob = ((z - cz) / 6) ** 2 + ((y - cy + 8) / 7) ** 2 + ((x - cx - 9) / 8) ** 2 < 1
    ct[blob] = 120.0
    blob2 = ((z - cz + 5) / 4) ** 2 + ((y - cy - 6) / 4) ** 2 + ((x - cx + 10) / 5) ** 2 < 1
    ct[blob2] = -60.0
    ct[:, int(cy + 0.25 * shape[1]) : int(cy + 0.3 * shape[1]), int(cx) - 3 : int(cx) + 3] = 700
    ct += rng.normal(0, 20, shape).astype(np.float32)
    ct[:2] = 0.0
    ct[:, :, :3] = 0.0
    return ct


def radserve_labels(
    bundle: Path,
    image: np.ndarray,
    spacing: tuple[float, float, float],
    channels: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """radserve's labels for ``bundle`` on ``image`` (its first channel, e.g. the CT) at
    ``spacing`` (z, y, x mm); ``channels``: the other channels' arrays by name."""
    spec = load_manifest(bundle / "model.yaml")
    volume = Volume.from_geometry(image, spacing=spacing)
    session = ModelSession(bundle / "model.onnx", spec)
    task = make_task(volume, spec, image_channels=channels)
    return run_task(task, session).labels.array


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """The fraction of voxels where the label maps ``a`` and ``b`` (same shape) agree."""
    assert a.shape == b.shape
    return float((a == b).mean())
