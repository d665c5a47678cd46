"""Whether a CT holds a body, from the shape of its tissue: how thick its thickest
cross-section is once the flat things are left out.

A share of the voxels above -500 HU cannot tell: a scanner table alone fills more than
1 % of a 50 cm field (the phantoms' 450 x 36 mm table fills ~6 % of a 46 cm one), and so
does a positioning cushion or a few phantom rods. What a patient has and those do not
is thickness in every direction of the axial plane: the smallest body part a site scans
(a wrist, a neonate's limb) holds a disc of 3 cm; a table is a slab a few cm thick that
spans the field, a head holder or a cushion's cover a shell, a rod a few cm at most.

On each of :data:`_SLICES` axial slices spread over the study (strided to at most
:data:`_MAX_SIDE` pixels a side):

1. tissue: pixels above :data:`BODY_HU` (Pixel Padding Value reads as air);
2. slabs out: a band of image rows (or columns) each holding tissue over most of the
   field's width (200 mm, or 90 % of a smaller field) that is at most
   :data:`MAX_SLAB_MM` (and a third of the field) thick is a table (with its pad), not a
   body: removed, so that a body or a cushion resting on it is judged alone. A body
   cut through by such a band (a wide patient in a tight field) keeps two thick halves;
3. each connected cross-section (cc3d, 8-connected) is a body's when the largest disc
   inscribed in it is at least :data:`MIN_BODY_THICKNESS_MM` across and its area is at
   most :data:`MAX_ELONGATION` times that diameter squared (a curved or short slab the
   band test missed is thin for its area: the phantoms' table ~12, an adult chest ~1-2,
   a limb lying on a table ~3).

The study's body thickness is the diameter of the thickest such cross-section (0 when
none). A slice whose whole field is tissue is a body at least as thick as the field (a
tight field inside a patient). The field's edge is not the object's edge: the inscribed
disc is measured to the air in view, so a body cut by the field is not made thin.
"""

from __future__ import annotations

import cc3d
import numpy as np
from scipy import ndimage

from radserve.domain.input_domain import (
    BODY_HU,
    MAX_ELONGATION,
    MAX_SLAB_MM,
    MIN_BODY_THICKNESS_MM,
)
from radserve.domain.volume import Volume, spread_slices

_SLICES = 16  # slices measured, evenly spaced: a study costs the same whatever its length
_MAX_SIDE = 256  # pixels a side of the strided slice (a 512 x 512 slice at stride 2)
_SLAB_MIN_WIDTH_MM = 200.0  # a table line holds tissue over at least this much ...
_SLAB_FIELD_SHARE = 0.9  # ... or this share of a smaller field
_SLAB_MIN_SLENDERNESS = 3.0  # and a slab's band is at most a third of the field's width


def body_thickness_mm(
    volume: Volume | np.ndarray, spacing: tuple[float, float] | None = None
) -> float:
    """The diameter (mm) of the thickest axial cross-section of tissue that is not a slab
    (module docstring); 0.0 when there is none. ``spacing`` (row, column mm) is needed
    for a bare array; a Volume carries its own."""
    if isinstance(volume, Volume):
        array = np.asarray(volume.array)
        dy, dx = volume.spacing[1], volume.spacing[2]
    else:
        if spacing is None:
            raise ValueError("body_thickness_mm of a bare array needs its (row, column) spacing")
        array, (dy, dx) = np.asarray(volume), spacing
    if array.ndim != 3 or 0 in array.shape:
        return 0.0
    step = max(1, -(-max(array.shape[1:]) // _MAX_SIDE))
    dy, dx = dy * step, dx * step
    thickest = 0.0
    for k in spread_slices(array.shape[0], _SLICES):
        tissue = np.asarray(array[k, ::step, ::step] > BODY_HU)
        thickest = max(thickest, _thickest_section(tissue, dy, dx))
    return thickest


def _thickest_section(tissue: np.ndarray, dy: float, dx: float) -> float:
    """:func:`body_thickness_mm` of one slice's tissue mask."""
    if not tissue.any():
        return 0.0
    if tissue.all():
        return max(tissue.shape[0] * dy, tissue.shape[1] * dx)
    tissue = _without_slabs(tissue, dy, dx)
    labels = cc3d.connected_components(tissue, connectivity=8)
    areas = np.bincount(labels.ravel()) * (dy * dx)
    areas[0] = 0.0
    # only a section that can hold the disc (pi/4 d^2) is measured, on its bounding box
    # and one pixel around it: the air that edges it (~5 ms per 256 x 256 slice spared)
    candidates = np.flatnonzero(areas >= np.pi / 4 * MIN_BODY_THICKNESS_MM**2)
    if candidates.size == 0:
        return 0.0
    rows, cols = np.nonzero(np.isin(labels, candidates))
    box = (
        slice(max(rows.min() - 1, 0), rows.max() + 2),
        slice(max(cols.min() - 1, 0), cols.max() + 2),
    )
    # the inscribed disc: twice the largest distance to the air in view
    distance = ndimage.distance_transform_edt(tissue[box], sampling=(dy, dx))
    diameters = 2.0 * np.asarray(
        ndimage.maximum(distance, labels[box], candidates), dtype=np.float64
    )
    compact = (diameters >= MIN_BODY_THICKNESS_MM) & (
        areas[candidates] <= MAX_ELONGATION * diameters**2
    )
    return float(diameters[compact].max()) if compact.any() else 0.0


def _without_slabs(tissue: np.ndarray, dy: float, dx: float) -> np.ndarray:
    """``tissue`` less every thin band of lines that hold tissue across the field (a
    table seen along the rows, or along the columns of a patient on their side)."""
    out = tissue.copy()
    for axis, along, across in ((1, dx, dy), (0, dy, dx)):  # rows, then columns
        length = tissue.shape[axis] * along
        wide = min(_SLAB_MIN_WIDTH_MM, _SLAB_FIELD_SHARE * length)
        full = tissue.sum(axis=axis) * along >= wide  # per line: tissue across the field
        bands, n = ndimage.label(full)
        if n == 0:
            continue
        sizes = np.bincount(bands, minlength=n + 1) * across
        # thin, and thin for the field: a body filling a small field is no slab
        slab = (sizes <= min(MAX_SLAB_MM, length / _SLAB_MIN_SLENDERNESS))[bands] & full
        if axis == 1:
            out[slab, :] = False
        else:
            out[:, slab] = False
    return out


__all__ = ["body_thickness_mm"]
