"""Morphological label-map ops (``opening``, ``closing``, ``fill_holes`` in model.yaml).

Each works on one label at a time, inside that label's bounding box grown by the
ball's radius (zero-padded beyond it, so the volume's edge counts as background), with
scipy.ndimage's binary operators. A label never takes another label's voxels: closing
and hole filling add only background voxels, opening turns removed voxels into
background. The ball is given in mm and becomes an ellipsoid of voxels on anisotropic
grids (a 1 mm ball on 2.5 mm slices is a disc in-plane).

Cost (CPU time of the op alone, 512 x 512 x 300 study with the reference organ map,
every label; measured once, see docs/model-ops.md): none unless a model declares it.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from radserve.models.ops import Closing, FillHoles, Opening
from radserve.preprocess.crop import BBox, bbox_of_values

MorphologyOp = Opening | Closing | FillHoles


def ball(radius_mm: float, spacing: tuple[float, float, float]) -> np.ndarray:
    """Voxels within ``radius_mm`` of the centre voxel (centre to centre), as a bool
    structure of odd size; at least the centre voxel."""
    r = [int(radius_mm // s) for s in spacing]
    grids = np.ogrid[tuple(slice(-n, n + 1) for n in r)]
    dist2 = sum((g * s) ** 2 for g, s in zip(grids, spacing, strict=True))
    return np.asarray(dist2 <= radius_mm**2 + 1e-9)


def apply_morphology(
    labels: np.ndarray,
    value: int,
    box: BBox,
    op: MorphologyOp,
    spacing: tuple[float, float, float],
) -> BBox | None:
    """Apply ``op`` to label ``value`` of ``labels`` in place (``box``: the label's tight
    box); returns the label's box after it (None when the label is gone)."""
    if isinstance(op, FillHoles):
        region = labels[box]
        mask = region == value
        if op.in_plane:
            filled = np.stack([ndimage.binary_fill_holes(m) for m in mask])
        else:
            filled = ndimage.binary_fill_holes(mask)
        region[filled & (region == 0)] = value
        return box  # holes lie inside the label's box
    structure = ball(op.radius_mm, spacing)
    r = [n // 2 for n in structure.shape]
    grown = tuple(
        slice(max(0, s.start - n), min(size, s.stop + n))
        for s, n, size in zip(box, r, labels.shape, strict=True)
    )
    region = labels[grown]
    mask = region == value
    pad = [(n + 1, n + 1) for n in r]
    work = np.pad(mask, pad)
    if isinstance(op, Opening):
        work = ndimage.binary_dilation(ndimage.binary_erosion(work, structure), structure)
    else:
        work = ndimage.binary_erosion(ndimage.binary_dilation(work, structure), structure)
    result = work[tuple(slice(a, a + n) for (a, _), n in zip(pad, mask.shape, strict=True))]
    if isinstance(op, Opening):
        region[mask & ~result] = 0
    else:
        region[result & ~mask & (region == 0)] = value
    # Opening only removes and closing stays inside the box: the new box is in ``box``.
    inner = bbox_of_values(labels[box], [value])
    if inner is None:
        return None
    return tuple(  # type: ignore[return-value]
        slice(b.start + i.start, b.start + i.stop) for b, i in zip(box, inner, strict=True)
    )
