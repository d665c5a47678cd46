"""Bounding boxes that let inference skip air: the body, or upstream labels' ROI.

``body_bbox`` thresholds a downsampled copy of the volume, projects it along the slice
axis, removes thin structures (the scanner table, cables, blanket folds) by a
morphological opening in millimetres, and keeps the largest connected component of the
projection. The slice range is where that in-plane region holds any body voxels.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import ndimage

from radserve.domain.volume import Volume

logger = logging.getLogger(__name__)

BBox = tuple[slice, slice, slice]

__all__ = ["BBox", "bbox_of_mask", "body_bbox", "expand_bbox", "full_bbox", "roi_bbox"]


def full_bbox(shape: tuple[int, ...]) -> BBox:
    """The whole volume."""
    return (slice(0, shape[0]), slice(0, shape[1]), slice(0, shape[2]))


def expand_bbox(bbox: BBox, margin_vox: tuple[int, int, int], shape: tuple[int, ...]) -> BBox:
    """Grow a box by a margin in voxels per axis, clipped to the volume."""
    return tuple(  # type: ignore[return-value]
        slice(max(0, s.start - m), min(n, s.stop + m))
        for s, m, n in zip(bbox, margin_vox, shape, strict=True)
    )


def bbox_of_mask(mask: np.ndarray) -> BBox | None:
    """Tight box around the true voxels of a 3-D mask; ``None`` when the mask is empty."""
    if mask.ndim != 3:
        raise ValueError(f"mask must be 3-D, got shape {mask.shape}")
    out = []
    for axis in range(3):
        other = tuple(a for a in range(3) if a != axis)
        hits = np.flatnonzero(mask.any(axis=other))
        if hits.size == 0:
            return None
        out.append(slice(int(hits[0]), int(hits[-1]) + 1))
    return tuple(out)  # type: ignore[return-value]


def roi_bbox(labels: Volume, values: list[int] | tuple[int, ...], margin_mm: float) -> BBox | None:
    """Box around the voxels of upstream ``labels`` holding any of ``values``, grown by
    ``margin_mm`` (``spec.input.roi_labels`` / ``roi_margin_mm``); ``None`` if absent."""
    box = bbox_of_mask(np.isin(labels.array, values))
    if box is None:
        return None
    return expand_bbox(box, _margin_vox(labels.spacing, margin_mm), labels.shape)


def _margin_vox(spacing: tuple[float, float, float], margin_mm: float) -> tuple[int, int, int]:
    return tuple(int(np.ceil(margin_mm / s)) for s in spacing)  # type: ignore[return-value]


def body_bbox(
    volume_hu: Volume,
    threshold: float = -500.0,
    *,
    margin_mm: float = 5.0,
    opening_mm: float = 12.0,
    step_mm: float = 3.0,
) -> BBox:
    """Box around the patient's body in native voxel indices, air and table excluded.

    Works on a grid of about ``step_mm`` so a 512x512x300 CT costs a few milliseconds.
    ``opening_mm`` must exceed the table's thickness and be smaller than the body.
    When no body is found (all air, or MR intensities) the whole volume is returned,
    so a model still sees everything rather than nothing.
    """
    shape = volume_hu.shape
    spacing = volume_hu.spacing
    steps = tuple(max(1, int(step_mm // s)) for s in spacing)
    small = volume_hu.array[:: steps[0], :: steps[1], :: steps[2]] > threshold
    projection = small.any(axis=0)
    radius = [
        max(1, round(opening_mm / 2 / (s * k))) for s, k in zip(spacing[1:], steps[1:], strict=True)
    ]
    structure = _ellipse(radius[0], radius[1])
    opened = ndimage.binary_opening(projection, structure=structure)
    labels, n = ndimage.label(opened)
    if n == 0:
        logger.info("no body above %s found; using the whole volume", threshold)
        return full_bbox(shape)
    sizes = np.bincount(labels.ravel())[1:]
    region = labels == (int(np.argmax(sizes)) + 1)
    rows = np.flatnonzero(region.any(axis=1))
    cols = np.flatnonzero(region.any(axis=0))
    in_region = (
        small[:, rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        & region[None, rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    )
    zs = np.flatnonzero(in_region.any(axis=(1, 2)))
    # Sample i sits at native i*k; the body starts after the previous (empty) sample and
    # ends before the next one.
    bbox = tuple(
        slice(max(0, (int(idx[0]) - 1) * k + 1), min(n, (int(idx[-1]) + 1) * k))
        for idx, k, n in zip((zs, rows, cols), steps, shape, strict=True)
    )
    return expand_bbox(bbox, _margin_vox(spacing, margin_mm), shape)


def _ellipse(ry: int, rx: int) -> np.ndarray:
    y, x = np.ogrid[-ry : ry + 1, -rx : rx + 1]
    return (y / ry) ** 2 + (x / rx) ** 2 <= 1.0
