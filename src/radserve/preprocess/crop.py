"""Bounding boxes that let inference skip air: the body, or upstream labels' ROI.

``body_bbox`` thresholds a downsampled copy of the volume, projects it along the slice
axis, removes thin structures (the scanner table, cables, blanket folds) by a
morphological opening in millimetres, and keeps the largest connected component of the
projection. The slice range is where that in-plane region holds any body voxels.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy import ndimage

from radserve.domain.volume import Volume

logger = logging.getLogger(__name__)

BBox = tuple[slice, slice, slice]

__all__ = [
    "BBox",
    "bbox_of_mask",
    "bbox_of_values",
    "bbox_union",
    "body_bbox",
    "body_sample_slices",
    "crop_volume",
    "expand_bbox",
    "full_bbox",
    "grid_offset",
    "label_bboxes",
    "nonzero_mask",
    "roi_bbox",
]


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


def nonzero_mask(arrays: Sequence[np.ndarray], *, fill_holes: bool = True) -> np.ndarray:
    """nnU-Net's ``create_nonzero_mask``: where any of the (same-shaped) channel arrays
    is non-zero, holes filled (SciPy, 6-connected background). Its bounding box is
    nnU-Net's crop (filling holes does not change the box: ``fill_holes=False`` saves
    the fill); inside it, the voxels a ``use_mask`` z-score is taken over."""
    if not arrays:
        raise ValueError("nonzero_mask needs at least one array")
    mask = np.asarray(arrays[0]) != 0
    for array in arrays[1:]:
        mask |= np.asarray(array) != 0
    return ndimage.binary_fill_holes(mask) if fill_holes else mask


def label_bboxes(labels: np.ndarray, max_value: int, *, threads: int = 1) -> list[BBox | None]:
    """Tight box of every label value ``1..max_value`` of an integer label map, in one
    pass and without a full-size temporary (``scipy.ndimage.find_objects``).

    Index ``v - 1`` holds the box of value ``v``, ``None`` where the value is absent.
    One pass over a 512 x 512 x 300 map costs about as much as one ``labels == v``, and
    allocates nothing of the map's size, where a mask per value would (peak memory).
    ``threads``: the slices cut into that many slabs, searched at once (find_objects
    lets go of the GIL) and their boxes joined: the same boxes.
    """
    if labels.ndim != 3:
        raise ValueError(f"labels must be 3-D, got shape {labels.shape}")
    if max_value < 1 or labels.size == 0:
        return [None] * max(0, max_value)
    if labels.dtype.kind not in "iu" or labels.dtype == np.uint64:
        labels = labels.astype(np.int64)
    slabs = max(1, min(threads, len(labels)))
    if slabs == 1:
        return _found(ndimage.find_objects(labels, max_label=max_value))
    cuts = [int(c) for c in np.linspace(0, len(labels), slabs + 1)]
    with ThreadPoolExecutor(slabs, thread_name_prefix="radserve-boxes") as pool:
        parts = list(
            pool.map(
                lambda z: _found(ndimage.find_objects(labels[z[0] : z[1]], max_label=max_value)),
                itertools.pairwise(cuts),
            )
        )
    joined: list[BBox | None] = []
    for value in range(max_value):
        boxes = [
            (slice(z0 + b[0].start, z0 + b[0].stop), b[1], b[2])
            for z0, part in zip(cuts, parts, strict=False)
            if (b := part[value]) is not None
        ]
        joined.append(bbox_union(boxes) if boxes else None)
    return joined


def bbox_union(boxes: Sequence[BBox]) -> BBox:
    """The tight box holding every one of ``boxes``."""
    return tuple(  # type: ignore[return-value]
        slice(min(b[a].start for b in boxes), max(b[a].stop for b in boxes)) for a in range(3)
    )


def _found(found: list[tuple[slice, ...] | None]) -> list[BBox | None]:
    return [None if box is None else tuple(box) for box in found]  # type: ignore[misc]


def bbox_of_values(
    labels: np.ndarray, values: Sequence[int], boxes: Sequence[BBox | None] | None = None
) -> BBox | None:
    """Tight box around the voxels of ``labels`` holding any of ``values`` (``None`` if
    none does); the same box as ``bbox_of_mask(np.isin(labels, values))`` without the
    full-size mask. ``boxes``: :func:`label_bboxes` of ``labels`` when already known
    (index ``v - 1``), which saves the pass over the map."""
    wanted = sorted({int(v) for v in values if int(v) > 0})
    if not wanted:
        return None
    if boxes is None or len(boxes) < wanted[-1]:
        boxes = label_bboxes(labels, wanted[-1])  # one pass for all values
    found = [b for b in (boxes[v - 1] for v in wanted) if b]
    return bbox_union(found) if found else None


def roi_bbox(
    labels: Volume,
    values: list[int] | tuple[int, ...],
    margin_mm: float,
    boxes: Sequence[BBox | None] | None = None,
) -> BBox | None:
    """Box around the voxels of upstream ``labels`` holding any of ``values``, grown by
    ``margin_mm`` (``spec.input.roi_labels`` / ``roi_margin_mm``); ``None`` if absent.
    ``boxes`` as in :func:`bbox_of_values`."""
    box = bbox_of_values(labels.array, values, boxes)
    if box is None:
        return None
    return expand_bbox(box, _margin_vox(labels.spacing, margin_mm), labels.shape)


def crop_volume(volume: Volume, box: BBox) -> Volume:
    """The sub-volume inside ``box`` (a view), with the affine that places it.

    Outputs of a model restricted to a region live on this sub-grid, so nothing of the
    whole volume's size is allocated for them; :func:`grid_offset` finds the box again.
    """
    start = np.array([s.start for s in box], dtype=np.float64)
    affine = volume.affine.copy()
    affine[:3, 3] = volume.index_to_patient(start)[0]
    uids = volume.source_sop_instance_uids
    return Volume(volume.array[box], affine, volume.frame_of_reference_uid, uids[box[0]])


def grid_offset(sub: Volume, ref: Volume, tol: float = 1e-3) -> tuple[int, int, int] | None:
    """Index of ``sub``'s first voxel in ``ref`` when ``sub`` is a box of ``ref``'s grid
    (same axes and spacing, whole-voxel shift, inside ``ref``), else ``None``."""
    if not np.allclose(sub.affine[:3, :3], ref.affine[:3, :3], atol=tol):
        return None
    index = ref.patient_to_index(sub.affine[:3, 3])[0]
    whole = np.rint(index)
    if np.abs(index - whole).max() > tol:
        return None
    offset = tuple(int(v) for v in whole)
    inside = all(
        o >= 0 and o + n <= m for o, n, m in zip(offset, sub.shape, ref.shape, strict=True)
    )
    return offset if inside else None  # type: ignore[return-value]


def _margin_vox(spacing: tuple[float, float, float], margin_mm: float) -> tuple[int, int, int]:
    return tuple(int(np.ceil(margin_mm / s)) for s in spacing)  # type: ignore[return-value]


def body_sample_slices(
    shape: tuple[int, int, int], spacing: tuple[float, float, float], step_mm: float = 3.0
) -> range:
    """The slices :func:`body_bbox` reads (every ``step_mm``): a volume still being
    decoded (:class:`radserve.ingest.arrival.SliceArrival`) decodes these first, so the
    body box is known, exactly, before the rest of the stack."""
    return range(0, shape[0], _body_steps(spacing, step_mm)[0])


def _body_steps(spacing: tuple[float, float, float], step_mm: float) -> tuple[int, int, int]:
    return tuple(max(1, int(step_mm // s)) for s in spacing)  # type: ignore[return-value]


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
    steps = _body_steps(spacing, step_mm)
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
