"""Whether a segmented structure lies wholly inside the assessed volume.

A segmentation that reaches the first or last slice, or the first or last row or column,
is cut off by the scanned range or the field of view: the structure goes on outside,
so its measured volume is only a lower bound. One with no voxel was not assessed at all
(outside the range, absent, or missed) — never a measurement of 0.

Limitation: the reconstruction circle of a CT (pixels outside it hold padding) is not
an edge here; an organ cut by the circle but not by the square image reads complete.
"""

from __future__ import annotations

from radserve.domain.findings import Coverage, Edge
from radserve.preprocess.crop import BBox

_EDGES: tuple[tuple[Edge, Edge], ...] = (
    ("first_slice", "last_slice"),
    ("first_row", "last_row"),
    ("first_column", "last_column"),
)


def edges_touched(box: BBox, shape: tuple[int, int, int]) -> tuple[Edge, ...]:
    """Edges of a ``shape`` volume that a (slice, row, column) bounding box reaches."""
    out: list[Edge] = []
    for axis, (low, high) in enumerate(_EDGES):
        start, stop, _ = box[axis].indices(shape[axis])
        if start == 0:
            out.append(low)
        if stop == shape[axis]:
            out.append(high)
    return tuple(out)


def coverage_of(box: BBox | None, shape: tuple[int, int, int]) -> tuple[Coverage, tuple[Edge, ...]]:
    """``not_found`` without a box; ``partial`` with the edges it touches; else ``complete``."""
    if box is None:
        return "not_found", ()
    edges = edges_touched(box, shape)
    return ("partial" if edges else "complete"), edges
