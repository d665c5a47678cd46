"""MONAI's ``CropForeground`` box on the model grid (``input.crop_foreground``).

The box is MONAI's ``generate_spatial_bounding_box`` then ``compute_bounding_box``
(monai.transforms, 1.6): foreground voxels in any channel, ``margin`` added, clamped to
the image only with ``allow_smaller``, then grown to a multiple of ``k_divisible``
around its start (``floor((new - old) / 2)`` moved back). It may reach past the image;
MONAI then pads with zeros, and so does :func:`foreground_window`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radserve.errors import ModelError
from radserve.models.manifest import CropForegroundSpec


@dataclass(frozen=True)
class ForegroundWindow:
    """The cropped image the network sees, laid on an extended grid.

    ``image``: (c, D, H, W), zero outside the box; ``origin``: where the model grid's
    voxel 0 lies on it; ``box``: the box (start, end) on it; ``windows``: where the box
    padded up to one patch (centred, as MONAI's inferer pads) starts, and its size."""

    image: np.ndarray
    origin: tuple[int, int, int]
    box: tuple[tuple[int, int, int], tuple[int, int, int]]
    windows: tuple[tuple[int, int, int], tuple[int, int, int]]


def foreground_box(image: np.ndarray, spec: CropForegroundSpec) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) per spatial axis of ``image`` (c, d, h, w), as MONAI computes them."""
    selected = (image > np.float32(spec.threshold)).any(axis=0)
    shape = np.asarray(selected.shape)
    start, end = np.zeros(3, np.int64), np.zeros(3, np.int64)
    for axis in range(3):
        hit = np.flatnonzero(selected.any(axis=tuple(a for a in range(3) if a != axis)))
        if hit.size == 0:
            raise ModelError(
                f"crop_foreground: no voxel of the normalised image is above "
                f"{spec.threshold} (MONAI's CropForeground box would be empty)"
            )
        start[axis] = hit[0] - spec.margin[axis]
        end[axis] = hit[-1] + spec.margin[axis] + 1
    if spec.allow_smaller:
        start, end = np.maximum(start, 0), np.minimum(end, shape)
    size = end - start
    k = np.asarray(spec.k_divisible)
    divisible = np.ceil(size / k).astype(np.int64) * k
    start = start - (divisible - size) // 2
    return start, start + divisible


def foreground_window(
    image: np.ndarray, spec: CropForegroundSpec, patch: tuple[int, int, int]
) -> ForegroundWindow:
    """``image`` (the normalised model grid) cropped to its box and zero elsewhere, on a
    grid holding both the model grid (its outputs come back from there) and the box
    padded to a patch (where the windows run)."""
    start, end = foreground_box(image, spec)
    shape = np.asarray(image.shape[1:])
    short = np.maximum(0, np.asarray(patch) - (end - start))
    win_start, win_end = start - short // 2, end + (short - short // 2)
    lo, hi = np.minimum(0, win_start), np.maximum(shape, win_end)
    out = np.zeros((image.shape[0], *(hi - lo)), np.float32)
    a, b = np.maximum(start, 0), np.minimum(end, shape)
    src = tuple(slice(int(x), int(y)) for x, y in zip(a, b, strict=True))
    dst = tuple(slice(int(x - o), int(y - o)) for x, y, o in zip(a, b, lo, strict=True))
    out[(slice(None), *dst)] = image[(slice(None), *src)]

    def ints(v: np.ndarray) -> tuple[int, int, int]:
        return tuple(int(x) for x in v)  # type: ignore[return-value]

    return ForegroundWindow(
        out,
        ints(-lo),
        (ints(start - lo), ints(end - lo)),
        (ints(win_start - lo), ints(win_end - win_start)),
    )
