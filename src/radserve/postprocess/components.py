"""Label-map clean-up: the manifest's map ops (drop specks, keep the largest organ piece,
morphology) in the order it lists them.

Models leave small false-positive islands and fragment organs; the manifest's
``postprocess`` ops say what to remove. Everything here is vectorised over
components (cc3d + ``np.bincount``), and works inside the bounding box of each run of
occupied slices (:func:`component_runs`), so sparse lesion maps cost little even on
512 x 512 x 300 volumes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cc3d
import numpy as np

from radserve.checkpoints import checkpoint
from radserve.models.manifest import LabelSpec, ModelSpec
from radserve.models.ops import FillHoles, KeepLargest, MinSize
from radserve.postprocess.labelwise import box_voxels, map_labels
from radserve.postprocess.morphology import apply_morphology
from radserve.preprocess.crop import BBox, label_bboxes

logger = logging.getLogger(__name__)

CONNECTIVITY = 26
"""Voxels touching by a face, edge or corner belong to one component (3-D)."""


_COUNT_CHUNK = 1 << 22  # voxels per step when reading component labels: bounded temporaries
_COUNT_SLAB = 4  # slices per step when counting component voxels: bounded temporaries


@dataclass(frozen=True, eq=False)
class ComponentRun:
    """Connected components of one run of consecutive occupied slices.

    ``components`` covers ``box`` (in the coordinates of the labelled array) and holds
    local ids ``1..n`` (0 is background); local id ``i`` is component ``first + i - 1``
    of the whole array. ``label``, ``counts`` and ``extents`` (first and last index
    along each axis, on ``box``: ``[z0, z1, y0, y1, x0, x1]``; ``None`` when not asked
    for) are indexed by local id.
    """

    box: BBox
    components: np.ndarray
    first: int
    label: np.ndarray
    counts: np.ndarray
    extents: np.ndarray | None

    @property
    def n(self) -> int:
        return len(self.counts) - 1

    def component_box(self, local: int) -> BBox:
        """Tight box of component ``local`` on the run's box (a run labelled with
        ``extents=True``)."""
        if self.extents is None:
            raise ValueError("the run was labelled without extents: component_runs(extents=True)")
        e = self.extents[local]
        return (slice(e[0], e[1] + 1), slice(e[2], e[3] + 1), slice(e[4], e[5] + 1))

    def local_lut(self, by_global: np.ndarray) -> np.ndarray:
        """Index by local id: ``by_global``'s value of each component, 0 for background."""
        lut = np.zeros(self.n + 1, dtype=by_global.dtype)
        lut[1:] = by_global[self.first : self.first + self.n]
        return lut


_OCCUPANCY_SLAB = 16  # slices compared at once while finding the occupied runs
_FEW_IDS = 4  # at most this many kept (or dropped) ids: voxels found by comparisons


def _occupancy(labels: np.ndarray, values: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, cols)``: per slice, whether each row and each column holds any of
    ``values``; gathered a slab at a time (no mask of the whole array)."""
    nz, ny, nx = labels.shape
    rows = np.zeros((nz, ny), bool)
    cols = np.zeros((nz, nx), bool)
    for z0 in range(0, nz, _OCCUPANCY_SLAB):
        part = labels[z0 : z0 + _OCCUPANCY_SLAB]
        mask = part == values[0] if len(values) == 1 else np.isin(part, values)
        rows[z0 : z0 + len(part)] = mask.any(axis=2)
        cols[z0 : z0 + len(part)] = mask.any(axis=1)
    return rows, cols


def _occupied_runs(
    labels: np.ndarray,
    values: Sequence[int],
    occupancy: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[BBox]:
    """Tight boxes of the runs of consecutive slices holding any of ``values``.

    No 26-connected component crosses a slice without such voxels, so each run can be
    labelled on its own, inside its own box: a few small lesions far apart then cost
    a few small boxes, not one box spanning them all. ``occupancy``:
    :func:`_occupancy` of ``labels``, when the caller has it.
    """
    rows, cols = occupancy if occupancy is not None else _occupancy(labels, values)
    occupied = rows.any(axis=1)
    edges = np.flatnonzero(np.diff(np.concatenate([[False], occupied, [False]]).astype(np.int8)))
    boxes: list[BBox] = []
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        r = np.flatnonzero(rows[start:stop].any(axis=0))
        c = np.flatnonzero(cols[start:stop].any(axis=0))
        boxes.append(
            (
                slice(int(start), int(stop)),
                slice(int(r[0]), int(r[-1]) + 1),
                slice(int(c[0]), int(c[-1]) + 1),
            )
        )
    return boxes


def component_runs(
    labels: np.ndarray,
    values: Sequence[int],
    *,
    extents: bool = True,
    occupancy: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[ComponentRun]:
    """26-connected components of the voxels holding any of ``values``, run by run.

    Voxels of different values are never joined (cc3d's multi-label mode). Global ids
    follow the runs in slice order and cc3d's raster order within each, which is the
    raster order of the whole array: the ids one cc3d pass over the whole array would
    give. Memory: the ids of the largest run's box, not of the whole foreground box.

    ``extents=False``: no component boxes, and the counts are taken over the selected
    voxels only (:func:`_selected_counts`), about 7x cheaper than ``cc3d.statistics``'s
    pass over every voxel of the box (its boxes and centroids are per-voxel work too):
    on a 300-slice organ map 0.03-0.04 against 0.25-0.29 CPU-s.

    ``occupancy``: :func:`_occupancy` of ``labels`` and ``values``, when already known.
    """
    wanted = [int(v) for v in values]
    runs: list[ComponentRun] = []
    first = 1
    if not wanted or labels.size == 0:
        return runs
    for box in _occupied_runs(labels, wanted, occupancy):
        part = labels[box]
        if len(wanted) == 1:
            # uint8, not bool: cc3d 4.1's binary path under-sizes its union-find array on
            # thin boxes (1x1x6 with two runs raises "maximum length exception").
            selected = (part == wanted[0]).view(np.uint8)
        else:
            selected = np.where(np.isin(part, wanted), part, 0).astype(part.dtype, copy=False)
        components, n = cc3d.connected_components(
            selected, connectivity=CONNECTIVITY, return_N=True
        )
        n = int(n)
        boxes: np.ndarray | None = None
        if extents:
            # Voxel count and extent of every component in one pass of cc3d's.
            stats = cc3d.statistics(components, no_slice_conversion=True)
            counts = stats["voxel_counts"].astype(np.int64)
            boxes = stats["bounding_boxes"].astype(np.int64)
        else:
            counts = _selected_counts(components, selected, n)
        label = np.zeros(n + 1, dtype=labels.dtype)
        if len(wanted) == 1:
            label[1:] = wanted[0]
        elif n:
            ids, values_flat = components.reshape(-1), selected.reshape(-1)
            for start in range(0, ids.size, _COUNT_CHUNK):
                chunk = ids[start : start + _COUNT_CHUNK]
                hit = chunk != 0
                label[chunk[hit]] = values_flat[start : start + _COUNT_CHUNK][hit]
        del selected
        runs.append(ComponentRun(box, components, first, label, counts, boxes))
        first += n
    return runs


def _selected_counts(components: np.ndarray, selected: np.ndarray, n: int) -> np.ndarray:
    """Voxels per component id (index 0, the background, left 0), counted over the
    selected voxels only, a slab at a time: an organ fills a fraction of its box, and
    ``np.bincount`` widens what it counts to int64 (bounded temporaries here)."""
    counts = np.zeros(n + 1, np.int64)
    mask = selected.view(bool) if selected.dtype == np.uint8 else selected != 0
    for z0 in range(0, len(components), _COUNT_SLAB):
        ids = components[z0 : z0 + _COUNT_SLAB][mask[z0 : z0 + _COUNT_SLAB]]
        counts += np.bincount(ids, minlength=n + 1)
    counts[0] = 0
    return counts


@dataclass(frozen=True, eq=False)
class CleanedLabels:
    """A cleaned label map and the tight box of every value ``1..max`` in it after
    cleaning (index ``v - 1``; ``None`` where the value is absent), so the next model's
    region of interest needs no further pass over the map."""

    labels: np.ndarray
    boxes: tuple[BBox | None, ...]


def clean_labels(
    labels: np.ndarray,
    spec: ModelSpec,
    voxel_volume_ml: float,
    *,
    in_place: bool = False,
    spacing: tuple[float, float, float] | None = None,
) -> np.ndarray:
    """:func:`clean_label_map`'s map alone."""
    return clean_label_map(labels, spec, voxel_volume_ml, in_place=in_place, spacing=spacing).labels


def _stages(ops: Sequence[Any]) -> list[Any]:
    """The map ops in order, each run of consecutive ``min_size`` / ``keep_largest`` ops
    gathered into one list: one component labelling serves the whole run (labelling is
    the expensive part, and such a run gives the same result in any order)."""
    stages: list[Any] = []
    for op in ops:
        if isinstance(op, MinSize | KeepLargest):
            if stages and isinstance(stages[-1], list):
                stages[-1].append(op)
            else:
                stages.append([op])
        else:
            stages.append(op)
    return stages


def clean_label_map(
    labels: np.ndarray,
    spec: ModelSpec,
    voxel_volume_ml: float,
    *,
    in_place: bool = False,
    within: BBox | None = None,
    spacing: tuple[float, float, float] | None = None,
    threads: int = 1,
) -> CleanedLabels:
    """Apply the manifest's label-map ops (:attr:`ModelSpec.map_ops`, in order); returns
    the cleaned map (same dtype) and every label's box after cleaning.

    - ``min_size``: components smaller than ``ml`` are removed;
    - ``keep_largest``: the label keeps only its largest component (of those
      ``min_size`` leaves, when both apply: the two commute);
    - ``opening`` / ``closing`` / ``fill_holes``: :mod:`radserve.postprocess.morphology`
      (needs ``spacing``).

    One label at a time, inside that label's own bounding box (all boxes found in one
    pass, with no mask of the whole map), and there run by run of occupied slices
    (:func:`component_runs`): component ids are uint32, so labelling a whole
    multi-organ box at once would cost four bytes per voxel of the whole foreground
    (over 300 MB on a 512 x 512 x 300 study); this way the temporaries stay at the size
    of the largest organ's box, and of a few small boxes for scattered lesions. cc3d
    never joins voxels of different labels, so the result is the same as labelling all
    labels together.

    Args:
        labels: (slice, row, column) integer label map.
        spec: the model whose output this is.
        voxel_volume_ml: volume of one voxel (``Volume.voxel_volume_ml``).
        in_place: clean ``labels`` itself instead of a copy.
        within: a box holding every non-zero voxel (``Prediction.extent``), when known:
            only it is searched for the labels' boxes.
        spacing: (slice, row, column) mm, for the morphology ops' balls.
        threads: the ``min_size`` / ``keep_largest`` ops' labels spread over this many
            threads (same result). Morphology stays on one: a closing may claim a
            background voxel that another label's closing claims too.
    """
    out = labels if in_place else labels.copy()
    values = sorted({label.value for label in spec.labels})
    # Every label's box in one pass, before any edit: an op on one label only changes
    # voxels of that label and background, so the boxes of the others stay exact.
    search = within or tuple(slice(0, n) for n in out.shape)
    found = label_bboxes(out[search], max(values), threads=threads) if values else []
    boxes = [None if b is None else _shifted_union([b], search) for b in found]
    removed = 0
    for stage in _stages(spec.map_ops):
        if isinstance(stage, list):
            removed += _component_rules(out, spec, stage, boxes, voxel_volume_ml, threads)
            continue
        if spacing is None and not isinstance(stage, FillHoles):
            raise ValueError(f"{spec.key}: postprocess op {stage.op!r} needs the voxel spacing")
        for label in spec.labels:
            checkpoint()  # a routine study's clean-up lets URGENT work pass here
            box = boxes[label.value - 1]
            if box is not None and spec.applies_to(stage, label):
                boxes[label.value - 1] = apply_morphology(
                    out, label.value, box, stage, spacing or (1.0, 1.0, 1.0)
                )
    logger.debug("clean_labels: %d components removed", removed)
    return CleanedLabels(out, tuple(boxes))


def _component_rules(
    out: np.ndarray,
    spec: ModelSpec,
    rules: list[Any],
    boxes: list[BBox | None],
    voxel_volume_ml: float,
    threads: int = 1,
) -> int:
    """One run of ``min_size`` / ``keep_largest`` ops, label by label (``boxes`` updated
    in place), the labels spread over ``threads`` threads
    (:func:`~radserve.postprocess.labelwise.map_labels`: a label's ops change only its
    own voxels and box); returns the number of components removed."""

    def one(label: LabelSpec) -> int:
        return _label_rules(out, spec, rules, boxes, voxel_volume_ml, label)

    return sum(map_labels(one, spec.labels, threads=threads, weight=box_voxels(boxes)))


def _label_rules(
    out: np.ndarray,
    spec: ModelSpec,
    rules: list[Any],
    boxes: list[BBox | None],
    voxel_volume_ml: float,
    label: LabelSpec,
) -> int:
    """:func:`_component_rules` for one label; returns the components it removed."""
    checkpoint()
    value = label.value
    min_ml = max(
        (op.ml for op in rules if isinstance(op, MinSize) and spec.applies_to(op, label)),
        default=0.0,
    )
    largest_only = any(isinstance(op, KeepLargest) and spec.applies_to(op, label) for op in rules)
    box = boxes[value - 1]
    if box is None or (min_ml <= 0 and not largest_only):
        return 0
    min_voxels = min_ml / voxel_volume_ml if voxel_volume_ml > 0 else 0.0
    region = out[box]  # a view: edits land in ``out``
    occupancy = _occupancy(region, [value])  # before any drop: for _tight_box too
    runs = component_runs(region, [value], extents=False, occupancy=occupancy)
    n = sum(run.n for run in runs)
    if n == 0:
        return 0
    counts = np.zeros(n + 1, dtype=np.int64)
    for run in runs:
        counts[run.first : run.first + run.n] = run.counts[1:]
    keep = counts >= min_voxels
    keep[0] = False
    if largest_only and keep.any():
        best = int(np.argmax(np.where(keep, counts, -1)))
        keep[:] = False
        keep[best] = True
    keep[0] = True  # background of the mask: voxels of other labels, untouched
    if keep.all():
        return 0
    for run in runs:
        drop = np.logical_not(run.local_lut(keep))
        drop[0] = False
        if drop.any():
            _clear_dropped(region[run.box], run.components, drop)
    del runs
    kept = _tight_box(region, value, occupancy)
    boxes[value - 1] = None if kept is None else _shifted_union([kept], box)
    return int(n + 1 - np.count_nonzero(keep))


def _clear_dropped(region: np.ndarray, components: np.ndarray, drop: np.ndarray) -> None:
    """Zero the voxels of ``region`` whose component id (``components``, 0 for none) is
    one ``drop`` marks: ``region[drop[components]] = 0``, a few slices at a time.

    Looking each voxel's id up in ``drop`` cost ~3 ns a voxel of the label's box (a
    lung's 12.6 M: 34 ms). ``keep_largest`` keeps one id and ``min_size`` usually drops
    a few, so where at most :data:`_FEW_IDS` ids are kept (or dropped) the voxels are
    found by comparing the ids with those, which numpy vectorises. Slab by slab, no
    mask of the whole box is made (it was the box's size in bytes)."""
    dropped = np.flatnonzero(drop)
    if dropped.size == 0:
        return
    kept = np.flatnonzero(~drop[1:]) + 1
    for z0 in range(0, len(components), _OCCUPANCY_SLAB):
        ids = components[z0 : z0 + _OCCUPANCY_SLAB]
        if len(kept) <= _FEW_IDS and len(kept) <= len(dropped):
            mask = ids != 0
            for i in kept:
                mask &= ids != i
        elif len(dropped) <= _FEW_IDS:
            mask = ids == dropped[0]
            for i in dropped[1:]:
                mask |= ids == i
        else:
            mask = drop[ids]
        region[z0 : z0 + _OCCUPANCY_SLAB][mask] = 0


def _tight_box(
    region: np.ndarray, value: int, occupancy: tuple[np.ndarray, np.ndarray]
) -> BBox | None:
    """The tight box of ``value`` in ``region``, which was tight before components were
    dropped from it: each side moves inward past the planes left without ``value``.

    Only planes that held ``value`` before the drop (``occupancy``, :func:`_occupancy`
    taken then) can hold it now, so only those are read: a speck far from the organ
    left empty planes between them in the box (up to 172 on the 300-slice bench
    study's organ map), and reading each of them cost 0.045-0.06 of the organ
    clean-up's CPU-s. Dropped components are specks, rarely at the box's faces, so
    this reads a plane or a few per face where a search of the whole box (or cc3d's
    per-component boxes) reads every voxel.
    """
    rows, cols = occupancy
    held = (rows.any(axis=1), rows.any(axis=0), cols.any(axis=0))
    lo, hi = [0, 0, 0], list(region.shape)
    for axis in range(3):
        view = np.moveaxis(region[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))], axis, 0)
        planes = np.flatnonzero(held[axis][lo[axis] : hi[axis]])
        first = next((int(p) for p in planes if (view[p] == value).any()), None)
        if first is None:
            return None
        # ``first`` holds the value: the search from the far side stops there at the latest
        last = next(int(p) for p in planes[::-1] if (view[p] == value).any())
        lo[axis], hi[axis] = lo[axis] + first, lo[axis] + last + 1
    return tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))  # type: ignore[return-value]


def _shifted_union(boxes: list[BBox], origin: BBox) -> BBox | None:
    """The box holding every one of ``boxes`` (given on ``origin``'s box), on the array."""
    if not boxes:
        return None
    return tuple(  # type: ignore[return-value]
        slice(o.start + min(b[a].start for b in boxes), o.start + max(b[a].stop for b in boxes))
        for a, o in enumerate(origin)
    )
