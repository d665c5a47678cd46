"""2.5D context: each slice with its through-plane neighbours, stacked as channels.

One function for inference (:class:`radserve.inference.slices.SliceTask`), training
(:mod:`radserve.training.data`) and the benchmark baselines, because a 2.5D model only
works on the inputs it was trained on: a different neighbour rule (or rounding) at
inference silently changes what the network sees.

Neighbour ``j`` (``j = -k..k``) of native slice ``z`` sits at fractional native slice
index ``z + j * step``, clamped to the volume (``0..nz-1``), linearly interpolated
between the two nearest native slices. ``step`` is ``None`` for the classic rule
(``model.yaml`` without ``context_mm``): integer offsets ``±1..k``, a plain gather, bit
for bit what radserve did before ``context_mm`` existed. With ``context_mm`` the step
is ``context_mm / slice_spacing``, so the network sees the same physical z-context
(e.g. ±2.5 mm and ±5 mm) on 0.625 mm and on 5 mm studies.

Interpolation happens on the raw intensities (HU), before in-plane resampling and
normalisation, as every caller does it in that order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "context_positions",
    "context_reach",
    "context_step",
    "gather_context",
    "sample_slices",
]

# Positions this close to a whole slice are snapped to it, so a step such as
# 2.5 mm / 1.2500000001 mm still reads native slices exactly.
_SNAP = 1e-6


def context_step(context_mm: float | None, slice_spacing_mm: float) -> float | None:
    """Native slices between neighbours: ``None`` (integer offsets) without ``context_mm``."""
    if context_mm is None:
        return None
    if not slice_spacing_mm > 0:
        raise ValueError(f"slice spacing must be positive, got {slice_spacing_mm}")
    return float(context_mm) / float(slice_spacing_mm)


def context_reach(k: int, step: float | None) -> int:
    """Whole native slices the outermost neighbour can reach on each side of a slice."""
    if step is None:
        return k
    return math.ceil(k * step - _SNAP)


def context_positions(items: Sequence[int] | np.ndarray, k: int, step: float | None, nz: int):
    """(N, 2k+1) fractional native slice indices of the neighbours, clamped to ``0..nz-1``."""
    z = np.asarray(items, dtype=np.int64).reshape(-1)
    offsets = np.arange(-k, k + 1)
    if step is None:
        return np.clip(z[:, None] + offsets[None, :], 0, nz - 1).astype(np.float64)
    pos = np.clip(z[:, None] + offsets[None, :] * float(step), 0.0, float(nz - 1))
    whole = np.rint(pos)
    return np.where(np.abs(pos - whole) < _SNAP, whole, pos)


def gather_context(
    array: np.ndarray,
    items: Sequence[int] | np.ndarray,
    k: int,
    step: float | None = None,
    box_yx: tuple[slice, slice] | None = None,
) -> np.ndarray:
    """(N, 2k+1, h, w) neighbours of native slices ``items`` of a (Z, Y, X) ``array``.

    ``box_yx`` crops rows and columns first (only the crop is read). The result is
    float32 (float64 input stays float64, like ``interpolate_axis``); with ``step``
    ``None`` the values are exactly the native slices, clamped at the volume's ends.
    """
    return sample_slices(array, context_positions(items, k, step, array.shape[0]), box_yx)


def sample_slices(
    array: np.ndarray, positions: np.ndarray, box_yx: tuple[slice, slice] | None = None
) -> np.ndarray:
    """``array`` (Z, Y, X) at fractional slice ``positions`` (any shape, inside
    ``0..Z-1``), blended linearly between the two nearest slices: ``positions.shape +
    (h, w)``, float32 (float64 stays float64). Whole positions are read exactly.

    Callers that already resampled the slices in-plane (the slice engine resamples each
    native slice of a batch once, not once per neighbour that reads it) pass the
    resampled stack and positions shifted to it; in-plane resampling and this blend are
    both linear, so the order changes nothing but float rounding.
    """
    ys, xs = box_yx if box_yx is not None else (slice(None), slice(None))
    nz = array.shape[0]
    dtype = np.float64 if array.dtype == np.float64 else np.float32
    pos = np.asarray(positions, dtype=np.float64)
    i0 = np.floor(pos).astype(np.intp)
    out = array[i0, ys, xs].astype(dtype, copy=False)  # fancy index: already a copy
    weight = pos - i0
    blend = weight > 0
    if blend.any():
        i1 = np.minimum(i0[blend] + 1, nz - 1)
        lo = out[blend]
        hi = array[i1, ys, xs].astype(dtype, copy=False)
        # lo + w * (hi - lo), as interpolate_axis blends.
        hi -= lo
        hi *= weight[blend].astype(dtype)[:, None, None]
        hi += lo
        out[blend] = hi
    return out
