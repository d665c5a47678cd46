"""One series onto another's grid through patient coordinates (PET onto CT, T2 onto T1).

Multi-series models (``input.channels``) take each channel on the reference series'
voxels. Both volumes' affines map indices to patient millimetres in one Frame of
Reference (the caller checks it is one), so the reference voxel ``i`` samples the source
at index ``inv(A_src) @ A_ref @ i``, by a B-spline of ``order`` (0 nearest, 1 trilinear,
3 cubic: the order the model's framework resamples images with). Voxel centres are the
sample points, the convention of :class:`~radserve.domain.volume.Volume`.

Coverage: a reference voxel whose centre lies inside the source's imaged volume (its
voxel centres plus half a voxel on every side, the slab a slice images) is *covered*;
within the last half voxel the edge voxel's value is repeated, as a radiologist reads
the edge of a slab. Outside, the voxel gets ``cval`` (0: no signal) and counts as not
covered; :func:`sample_onto` returns the covered fraction so the caller can refuse or
flag a sequence that images less than the reference (a small-FOV T2 beside a 3D T1).

Two series on one grid (the sequences of one MR acquisition) keep their own voxels bit
for bit: trilinear weights a rounding error away from 0 and 1 would otherwise leak a
1e-16 share of a neighbour into every voxel, enough to make a zero voxel non-zero
(MONAI's ``NormalizeIntensity(nonzero)``).
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import affine_transform

from radserve.domain.volume import Volume
from radserve.preprocess.resample import DEFAULT_MAX_VOXELS, check_grid

__all__ = ["INTERPOLATION_ORDERS", "covered_mask", "resample_onto", "sample_onto"]

INTERPOLATION_ORDERS = {"nearest": 0, "linear": 1, "cubic": 3}
"""``input.channel_interpolation`` names and their spline orders."""

_EDGE_TOLERANCE = 1e-6  # index units: a reference voxel exactly on the slab's edge is in


def resample_onto(
    source: Volume, reference: Volume, *, order: int = 1, cval: float = 0.0
) -> Volume:
    """``source`` sampled at ``reference``'s voxel centres (float32, reference geometry)."""
    return sample_onto(source, reference, order=order, cval=cval)[0]


def sample_onto(
    source: Volume,
    reference: Volume,
    *,
    order: int = 1,
    cval: float = 0.0,
    max_voxels: int = DEFAULT_MAX_VOXELS,
) -> tuple[Volume, float]:
    """``source`` on ``reference``'s grid, and the fraction of its voxels ``source`` covers
    (``max_voxels``: the site's ``ingest.max_voxels``, which bounds that grid)."""
    check_grid(reference.shape, max_voxels=max_voxels)
    to_source = np.linalg.inv(source.affine) @ reference.affine
    if source.shape == reference.shape and np.allclose(to_source, np.eye(4), rtol=0, atol=1e-6):
        return reference.with_array(source.array.astype(np.float32)), 1.0  # one grid
    out = affine_transform(
        source.array.astype(np.float32, copy=False),
        to_source[:3, :3],
        offset=to_source[:3, 3],
        output_shape=reference.shape,
        output=np.float32,
        order=order,
        mode="nearest",
    )
    inside = covered_mask(to_source, source.shape, reference.shape)
    out[~inside] = cval
    return reference.with_array(out), float(inside.mean())


def covered_mask(
    to_source: np.ndarray, source_shape: tuple[int, ...], shape: tuple[int, ...]
) -> np.ndarray:
    """Boolean ``shape`` mask: the voxels whose centre ``to_source`` (a 4x4 index map)
    places inside the source's imaged volume, ``[-0.5, n - 0.5]`` on every axis."""
    m, t = to_source[:3, :3], to_source[:3, 3]
    lo = np.full((3, 1, 1), -0.5 - _EDGE_TOLERANCE)
    hi = (np.asarray(source_shape[:3], float) - 0.5 + _EDGE_TOLERANCE)[:, None, None]
    rows, cols = np.meshgrid(np.arange(shape[1]), np.arange(shape[2]), indexing="ij")
    plane = m[:, 1, None, None] * rows + m[:, 2, None, None] * cols + t[:, None, None]
    out = np.empty(shape[:3], bool)
    for k in range(shape[0]):  # one slice at a time: no (3, z, y, x) float64 array
        at = plane + m[:, 0, None, None] * k
        out[k] = np.all((at >= lo) & (at <= hi), axis=0)
    return out
