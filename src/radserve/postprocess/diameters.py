"""RECIST-style axial diameters of one lesion, in millimetres.

For every slice the lesion occupies, the longest in-plane diameter is measured between
points of the convex hull of its pixels, in physical millimetres (the in-plane axes of
the affine, so non-square pixels and oblique planes are handled). The key slice is the
one with the longest diameter; on it the short axis is the longest chord of the hull
perpendicular to the long axis (computed exactly, not with an angle tolerance).

Cost stays small for big lesions: only each row's leftmost and rightmost pixel enter
the hull (the hull of a pixel set equals the hull of its row extremes), and pairwise
distances run over hull vertices only.

Edge convention: pixel centres of the outermost pixels lie about half a pixel inside
the object's edge, so each diameter adds one pixel's extent along its own direction
(the width, in that direction, of the ellipse inscribed in a pixel). A single pixel
therefore measures one pixel across, and a digitised sphere of radius r measures ~2r.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Point2 = tuple[float, float]
Point3 = tuple[float, float, float]

_EPS = 1e-9


class FindingAxes(BaseModel):
    """Where a finding's RECIST diameters were measured, for SR coordinates and drawings.

    Endpoints are fractional (row, column) voxel indices on ``slice_index`` of the
    prediction grid, and the same points in LPS patient millimetres. The segment between
    each pair has exactly the reported length.
    """

    model_config = ConfigDict(frozen=True)

    finding_id: int = 0
    slice_index: int
    longest_diameter_mm: float
    short_axis_mm: float
    long_axis: tuple[Point2, Point2] = Field(description="(row, column) endpoints")
    short_axis: tuple[Point2, Point2] = Field(description="(row, column) endpoints")
    long_axis_lps: tuple[Point3, Point3] = Field(description="LPS endpoints")
    short_axis_lps: tuple[Point3, Point3] = Field(description="LPS endpoints")


class _Plane:
    """Maps a slice's (row, column) indices to orthonormal 2-D millimetre coordinates."""

    def __init__(self, affine: np.ndarray) -> None:
        self.row_col = np.asarray(affine[:3, 1:3], dtype=np.float64)  # (3, 2)
        _, r = np.linalg.qr(self.row_col)
        self.r = r  # 2x2: [row, col] -> in-plane mm (exact for skewed axes too)
        self.r_inv = np.linalg.inv(r)

    def to_mm(self, rc: np.ndarray) -> np.ndarray:
        return rc @ self.r.T

    def to_rc(self, xy: np.ndarray) -> np.ndarray:
        return xy @ self.r_inv.T

    def pixel_extent(self, direction: np.ndarray) -> float:
        """Width along a unit in-plane direction of the ellipse inscribed in one pixel."""
        return float(np.linalg.norm(self.r.T @ direction))


def _row_extremes(mask2d_any: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    rows = np.flatnonzero(mask2d_any)
    pts = np.concatenate(
        [np.stack([rows, first[rows]], axis=1), np.stack([rows, last[rows]], axis=1)]
    )
    return np.unique(pts, axis=0).astype(np.float64)


def _hull(points: np.ndarray) -> tuple[np.ndarray, bool]:
    """Ordered hull vertices (counter-clockwise), or the points when they are collinear."""
    if len(points) < 3:
        return points, False
    # Imported here: scipy.spatial (Qhull, and scipy.sparse with it) costs the serving
    # process ~6-12 MiB resident, and a study without findings never measures a hull.
    from scipy.spatial import ConvexHull, QhullError

    try:
        hull = ConvexHull(points)
    except QhullError:
        return points, False
    return points[hull.vertices], True


def _longest_pair(points: np.ndarray) -> tuple[int, int, float]:
    diff = points[:, None, :] - points[None, :, :]
    d2 = np.einsum("ijk,ijk->ij", diff, diff)
    i, j = np.unravel_index(int(np.argmax(d2)), d2.shape)
    return int(i), int(j), float(np.sqrt(d2[i, j]))


def _perpendicular_chord(
    polygon: np.ndarray, u: np.ndarray, v: np.ndarray
) -> tuple[float, float, float, float]:
    """Longest chord along ``v`` of a convex polygon: (length, t, s_low, s_high).

    The chord length as a function of position t along ``u`` is concave on a convex
    polygon and piecewise linear, so its maximum sits at a vertex's t.
    """
    t, s = polygon @ u, polygon @ v
    t0, t1, s0, s1 = t, np.roll(t, -1), s, np.roll(s, -1)
    dt = t1 - t0
    tk = t[:, None]
    spans = (
        (tk >= np.minimum(t0, t1)[None] - 1e-7)
        & (tk <= np.maximum(t0, t1)[None] + 1e-7)
        & (np.abs(dt)[None] > _EPS)
    )
    frac = (tk - t0[None]) / np.where(np.abs(dt) > _EPS, dt, 1.0)[None]
    sk = s0[None] + np.clip(frac, 0.0, 1.0) * (s1 - s0)[None]
    high = np.where(spans, sk, -np.inf).max(axis=1)
    low = np.where(spans, sk, np.inf).min(axis=1)
    length = np.where(np.isfinite(high) & np.isfinite(low), high - low, 0.0)
    k = int(np.argmax(length))
    if not np.isfinite(high[k]):
        return 0.0, float(t[k]), float(s[k]), float(s[k])
    return float(length[k]), float(t[k]), float(low[k]), float(high[k])


def _slice_axes(
    points_mm: np.ndarray, plane: _Plane
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Long and short axis of one slice: lengths and (2, 2) mm endpoints of each."""
    polygon, is_polygon = _hull(points_mm)
    if len(polygon) == 1:
        # One pixel: measure along the pixel's longer side.
        ext = [plane.pixel_extent(e) for e in np.eye(2)]
        u = np.eye(2)[int(np.argmax(ext))]
        a = b = polygon[0]
        length = 0.0
    else:
        i, j, length = _longest_pair(polygon)
        a, b = polygon[i], polygon[j]
        u = (b - a) / length
    v = np.array([-u[1], u[0]])
    if is_polygon:
        chord, t, s_low, s_high = _perpendicular_chord(polygon, u, v)
    else:
        chord, t, s_low, s_high = 0.0, float(((a + b) / 2) @ u), float(a @ v), float(a @ v)
    long_pad, short_pad = plane.pixel_extent(u), plane.pixel_extent(v)
    long_ends = np.stack([a - u * long_pad / 2, b + u * long_pad / 2])
    short_ends = np.stack(
        [t * u + (s_low - short_pad / 2) * v, t * u + (s_high + short_pad / 2) * v]
    )
    return length + long_pad, chord + short_pad, long_ends, short_ends


def axial_diameters(
    mask: np.ndarray, affine: np.ndarray, offset: tuple[int, int, int] = (0, 0, 0)
) -> FindingAxes:
    """Measure one lesion given as a boolean (slice, row, column) mask.

    Args:
        mask: the lesion, usually cropped to its bounding box.
        affine: the full volume's affine (index -> LPS mm).
        offset: index of ``mask[0, 0, 0]`` in the full volume.
    """
    if not mask.any():
        raise ValueError("axial_diameters needs a non-empty mask")
    plane = _Plane(affine)
    ncol = mask.shape[2]
    rows_any = mask.any(axis=2)
    first = mask.argmax(axis=2)
    last = ncol - 1 - mask[:, :, ::-1].argmax(axis=2)
    best: tuple[float, float, np.ndarray, np.ndarray, int] | None = None
    for z in np.flatnonzero(rows_any.any(axis=1)):
        rc = _row_extremes(rows_any[z], first[z], last[z])
        rc += np.array(offset[1:], dtype=np.float64)
        long_mm, short_mm, long_ends, short_ends = _slice_axes(plane.to_mm(rc), plane)
        if best is None or long_mm > best[0] + 1e-9:
            best = (long_mm, short_mm, long_ends, short_ends, int(z) + offset[0])
    assert best is not None
    long_mm, short_mm, long_ends, short_ends, z = best
    long_rc, short_rc = plane.to_rc(long_ends), plane.to_rc(short_ends)

    def to_patient(rc: np.ndarray) -> tuple[Point3, Point3]:
        idx = np.column_stack([np.full(2, float(z)), rc])
        pts = idx @ np.asarray(affine[:3, :3]).T + np.asarray(affine[:3, 3])
        return (_p3(pts[0]), _p3(pts[1]))

    return FindingAxes(
        slice_index=z,
        longest_diameter_mm=long_mm,
        short_axis_mm=short_mm,
        long_axis=(_p2(long_rc[0]), _p2(long_rc[1])),
        short_axis=(_p2(short_rc[0]), _p2(short_rc[1])),
        long_axis_lps=to_patient(long_rc),
        short_axis_lps=to_patient(short_rc),
    )


def _p2(p: np.ndarray) -> Point2:
    return (float(p[0]), float(p[1]))


def _p3(p: np.ndarray) -> Point3:
    return (float(p[0]), float(p[1]), float(p[2]))
