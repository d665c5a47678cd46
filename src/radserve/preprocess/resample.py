"""Resample volumes to a model's spacing, and back, on one grid convention.

Grid convention (the same as nnU-Net / ``skimage.transform.resize`` and
``scipy.ndimage.zoom(grid_mode=True)``): resampling keeps the field of view. An axis of
``n`` voxels at spacing ``s`` covers ``n * s`` mm, from half a voxel before the first
centre to half a voxel after the last. The new axis has ``m = max(1, round(n * s / t))``
voxels for target spacing ``t``, and its voxels tile the *same* extent, so both field of
view edges line up exactly and the actual new spacing is ``n * s / m`` (within half a
voxel over the whole extent of ``t``; the returned affine carries the actual value).
New voxel ``j`` samples old fractional index ``(j + 0.5) * n / m - 0.5``; the inverse
mapping has the same form with ``n`` and ``m`` swapped, which is how model outputs are
mapped back onto the native grid voxel for voxel.

Interpolation is separable (one axis at a time) with edge values replicated outside the
first/last centre: linear (``order=1``) for images and probabilities, nearest
(``order=0``) for label maps. There is no anti-aliasing filter when downsampling, like
nnU-Net's preprocessing; training data made with these functions sees the same images.

The output grid is bounded before anything is allocated, by the site's
``ingest.max_voxels`` (``max_voxels``: the run path passes its ingest policy's; a caller
with no settings gets :class:`~radserve.ingest.policy.IngestPolicy`'s default, the one
definition of the bound): ingest bounds the volume it builds, and a model's spacing
finer than the study's would otherwise build a larger one here. Before 2026-12-07 the
bound was a constant of its own, 2**31 voxels (8 GiB as float32), whatever the site set.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from radserve.domain.volume import Volume
from radserve.errors import GeometryError
from radserve.ingest.policy import IngestPolicy, policy_hint

logger = logging.getLogger(__name__)

DEFAULT_MAX_VOXELS: int = IngestPolicy.max_voxels
"""The bound where a caller passes none: ``ingest.max_voxels``' default, read from
:class:`IngestPolicy` so that the two cannot drift apart."""

__all__ = [
    "DEFAULT_MAX_VOXELS",
    "check_grid",
    "describe_resampling",
    "grid_coordinates",
    "interpolate_axis",
    "resample_inplane",
    "resample_to_spacing",
    "resampled_shape",
    "resampled_size",
]


def resampled_size(
    n: int, spacing: float, target: float, *, max_voxels: int = DEFAULT_MAX_VOXELS
) -> int:
    """Voxels along an axis of ``n`` voxels at ``spacing`` once resampled to ``target``
    (refused past ``max_voxels`` along this one axis, before ``round`` meets an infinity)."""
    if not (math.isfinite(target) and math.isfinite(spacing)) or target <= 0 or spacing <= 0:
        raise ValueError(f"spacings must be positive, got {spacing} -> {target}")
    size = n * spacing / target
    if not size <= max_voxels:  # also catches inf from 1e308 / 1e-308
        raise GeometryError(
            f"resampling {n} voxels at {spacing:g} mm to {target:g} mm would need {size:.3g} "
            f"voxels along one axis, more than ingest.max_voxels={max_voxels}",
            code="series_too_large",
        )
    return max(1, round(size))


def resampled_shape(
    shape: tuple[int, ...],
    spacing: tuple[float, ...],
    target: tuple[float | None, ...],
    *,
    max_voxels: int = DEFAULT_MAX_VOXELS,
) -> tuple[int, ...]:
    """The grid :func:`resample_to_spacing` makes of ``shape`` at ``spacing`` for
    ``target`` (a ``None`` keeps that axis), each axis bounded; not yet checked whole."""
    return tuple(
        n if t is None else resampled_size(n, s, t, max_voxels=max_voxels)
        for n, s, t in zip(shape, spacing, target, strict=True)
    )


def describe_resampling(
    shape: tuple[int, ...], spacing: tuple[float, ...], target: tuple[float | None, ...]
) -> str:
    """``shape`` at ``spacing`` resampled to ``target``, in words (a refusal names it)."""
    kept = tuple(s if t is None else t for s, t in zip(spacing, target, strict=True))
    return f"{_times(shape)} voxels at {_times(spacing)} mm resampled to {_times(kept)} mm"


def check_grid(
    shape: tuple[int, ...],
    what: str = "resampled grid",
    *,
    max_voxels: int = DEFAULT_MAX_VOXELS,
) -> None:
    """Refuse a grid of more than ``max_voxels`` (the site's ``ingest.max_voxels``)
    before it is allocated: the largest volume the site builds at ingest is the largest
    it builds anywhere (``series_too_large``, the code of ingest's own refusal)."""
    voxels = math.prod(shape)
    if voxels <= max_voxels:
        return
    raise GeometryError(
        f"the {what} would be {_times(shape)} = {voxels} voxels, more than "
        f"ingest.max_voxels={max_voxels}, the largest volume this site builds: the study's "
        "spacing or field of view is implausible, or the model's spacing too fine for a "
        f"study this large (if the study is genuine, {policy_hint('max_voxels', str(voxels))})",
        code="series_too_large",
    )


def _times(values: tuple[float, ...]) -> str:
    return " × ".join(f"{v:g}" for v in values)


def grid_coordinates(n_in: int, n_out: int) -> np.ndarray:
    """Fractional input indices sampled by each of ``n_out`` voxels spanning the same extent."""
    return (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5


def interpolate_axis(
    array: np.ndarray, axis: int, coords: np.ndarray, *, order: int, both_weights: bool = False
) -> np.ndarray:
    """Sample ``array`` along one axis at fractional ``coords`` (edge values replicated).

    ``order=1`` blends the two neighbours and returns float32 (float64 stays float64);
    ``order=0`` picks the nearest and keeps the dtype, so label values are never mixed.
    ``both_weights``: ``lo * (i0 + 1 - c) + hi * (c - i0)`` as ``grid_sample`` weighs
    them, so a weight far below float32's epsilon on ``lo`` survives (``lo + w * (hi -
    lo)`` with ``w`` rounded to 1 loses it).
    """
    n = array.shape[axis]
    if order == 0:
        idx = np.clip(np.floor(coords + 0.5), 0, n - 1).astype(np.intp)
        return np.take(array, idx, axis=axis)
    if order != 1:
        raise ValueError(f"order must be 0 (nearest) or 1 (linear), got {order}")
    c = np.clip(coords, 0.0, n - 1)
    i0 = np.floor(c).astype(np.intp)
    i1 = np.minimum(i0 + 1, n - 1)
    dtype = np.float64 if array.dtype == np.float64 else np.float32
    w = (c - i0).astype(dtype)
    shape = [1] * array.ndim
    shape[axis] = len(c)
    w = w.reshape(shape)
    lo = np.take(array, i0, axis=axis).astype(dtype, copy=False)
    hi = np.take(array, i1, axis=axis).astype(dtype, copy=False)
    if both_weights:
        lo *= (i0 + 1 - c).astype(dtype).reshape(shape)
        hi *= w
        hi += lo
        return hi
    # lo + w * (hi - lo), in place to keep one temporary.
    hi -= lo
    hi *= w
    hi += lo
    return hi


def _resample_array(array: np.ndarray, out_shape: tuple[int, ...], order: int) -> np.ndarray:
    """Resample the leading ``len(out_shape)`` axes of ``array`` to ``out_shape``.

    Axes that shrink are done first so later passes work on fewer voxels.
    """
    axes = sorted(range(len(out_shape)), key=lambda a: out_shape[a] / array.shape[a])
    out = array
    for axis in axes:
        n_in, n_out = out.shape[axis], out_shape[axis]
        if n_in == n_out:
            continue
        out = interpolate_axis(out, axis, grid_coordinates(n_in, n_out), order=order)
    if order == 1 and out.dtype not in (np.float32, np.float64):
        out = out.astype(np.float32)
    return out


def _resampled_affine(affine: np.ndarray, in_shape: tuple[int, ...], out_shape: tuple[int, ...]):
    """Affine of the resampled grid: scale each index axis, shift the first centre."""
    scale = np.array([n_in / n_out for n_in, n_out in zip(in_shape, out_shape, strict=True)])
    index_map = np.eye(4)
    index_map[:3, :3] = np.diag(scale)
    index_map[:3, 3] = 0.5 * scale - 0.5
    return affine @ index_map


def resample_to_spacing(
    volume: Volume,
    spacing: tuple[float | None, float, float],
    *,
    order: int,
    max_voxels: int = DEFAULT_MAX_VOXELS,
    grid: str = "grid of",
) -> Volume:
    """Resample to (slice, row, column) ``spacing`` in mm; a ``None`` slice spacing keeps
    the native slices (and their source instance references).

    ``order`` 1 (linear, float32 out) for images and probabilities, 0 (nearest, dtype
    kept) for label maps; ``max_voxels``: the site's ``ingest.max_voxels``, checked
    (:func:`check_grid`) before the new grid is allocated, a refusal putting ``grid``
    before the resampling it describes (a model's task names the model). See the module
    docstring for the grid convention.
    """
    native = volume.spacing
    out_shape = resampled_shape(volume.shape, native, spacing, max_voxels=max_voxels)
    check_grid(
        out_shape,
        f"{grid} {describe_resampling(volume.shape, native, spacing)}",
        max_voxels=max_voxels,
    )
    if out_shape == volume.shape:
        array = volume.array
        if order == 1 and array.dtype not in (np.float32, np.float64):
            array = array.astype(np.float32)
        return volume.with_array(array)
    array = _resample_array(volume.array, out_shape, order)
    affine = _resampled_affine(volume.affine, volume.shape, out_shape)
    uids = volume.source_sop_instance_uids if out_shape[0] == volume.shape[0] else ()
    logger.debug("resampled %s at %s mm -> %s (order %d)", volume.shape, native, out_shape, order)
    return Volume(array, affine, volume.frame_of_reference_uid, uids)


def resample_inplane(
    volume: Volume,
    spacing_yx: tuple[float, float],
    *,
    order: int,
    max_voxels: int = DEFAULT_MAX_VOXELS,
) -> Volume:
    """Resample rows and columns to ``spacing_yx`` mm, keeping every native slice.

    This is what 2D/2.5D models see; training data must be made with this function.
    """
    return resample_to_spacing(
        volume, (None, spacing_yx[0], spacing_yx[1]), order=order, max_voxels=max_voxels
    )
