"""Overlap and surface-distance metrics between two binary masks on one voxel grid.

Conventions (the same as MONAI's ``compute_dice`` / ``compute_hausdorff_distance`` with
``percentile=95``):

* ``dice(a, b) = 2 |a & b| / (|a| + |b|)``. Both masks empty: ``nan`` (undefined; the
  organ is absent from the study and from the prediction, so there is nothing to score
  and aggregations skip it). Exactly one empty: ``0.0``.
* ``hd95(a, b, spacing)``: surface voxels are mask voxels with at least one
  6-connected background neighbour (voxels on the volume border count as surface).
  Distances are Euclidean in millimetres between voxel centres (``spacing`` is the
  (slice, row, column) voxel size). The directed 95th percentile is taken from a's
  surface to b's and from b's to a's, and the larger of the two is returned (symmetric).
  Both masks empty: ``nan`` (undefined). Exactly one empty: ``inf`` (the distance to a
  missing surface is unbounded); aggregations report such studies in a note and
  exclude them from the mean so one missed organ does not hide the others.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

__all__ = ["dice", "hd95", "surface"]

_CROSS = ndimage.generate_binary_structure(3, 1)


def _as_bool(mask: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(mask)
    if array.ndim != 3:
        raise ValueError(f"{name} must be a 3-D mask (slice, row, column), got {array.shape}")
    return array.astype(bool, copy=False)


def _check_same_shape(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise ValueError(f"masks must share one grid, got shapes {a.shape} and {b.shape}")


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two masks: 1.0 identical, 0.0 disjoint, ``nan`` both empty."""
    a = _as_bool(a, "a")
    b = _as_bool(b, "b")
    _check_same_shape(a, b)
    total = int(np.count_nonzero(a)) + int(np.count_nonzero(b))
    if total == 0:
        return float("nan")
    return 2.0 * int(np.count_nonzero(a & b)) / total


def surface(mask: np.ndarray) -> np.ndarray:
    """Voxels of ``mask`` with a 6-connected background neighbour (border voxels count)."""
    mask = _as_bool(mask, "mask")
    return mask & ~ndimage.binary_erosion(mask, structure=_CROSS, border_value=0)


def hd95(a: np.ndarray, b: np.ndarray, spacing: tuple[float, float, float]) -> float:
    """Symmetric 95th-percentile Hausdorff distance in mm between the masks' surfaces.

    ``nan`` when both masks are empty, ``inf`` when exactly one is. Work is restricted to
    the bounding box of the two masks together: every surface voxel lies inside it, so
    the distances are exact.
    """
    a = _as_bool(a, "a")
    b = _as_bool(b, "b")
    _check_same_shape(a, b)
    if len(spacing) != 3 or any(s <= 0 for s in spacing):
        raise ValueError(f"spacing must be three positive mm values, got {spacing}")
    has_a, has_b = bool(a.any()), bool(b.any())
    if not has_a and not has_b:
        return float("nan")
    if not has_a or not has_b:
        return float("inf")
    union = a | b
    box = tuple(
        slice(int(idx[0]), int(idx[-1]) + 1)
        for idx in (np.flatnonzero(union.any(axis=other)) for other in ((1, 2), (0, 2), (0, 1)))
    )
    surf_a, surf_b = surface(a[box]), surface(b[box])
    sampling = tuple(float(s) for s in spacing)
    # Distance from every voxel to the nearest surface voxel of the other mask.
    to_b = ndimage.distance_transform_edt(~surf_b, sampling=sampling)
    to_a = ndimage.distance_transform_edt(~surf_a, sampling=sampling)
    return float(max(np.percentile(to_b[surf_a], 95), np.percentile(to_a[surf_b], 95)))
