"""Array operations the policy can ask for: regular slice grid, shear correction.

Both interpolate linearly and round back to the input's integer type, so an int16 CT
stays int16 and keeps whole Hounsfield units.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage


def resample_slices(array: np.ndarray, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Linear interpolation along axis 0 from positions ``source`` to ``target`` (mm)."""
    upper = np.clip(np.searchsorted(source, target, side="right"), 1, len(source) - 1)
    lower = upper - 1
    weight = np.clip((target - source[lower]) / (source[upper] - source[lower]), 0.0, 1.0)
    out = np.empty((len(target), *array.shape[1:]), dtype=array.dtype)
    for k, (lo, hi, w) in enumerate(zip(lower, upper, weight, strict=True)):
        if w < 1e-6:
            out[k] = array[lo]
        elif w > 1 - 1e-6:
            out[k] = array[hi]
        else:
            blend = array[lo].astype(np.float32) * (1 - w) + array[hi].astype(np.float32) * w
            out[k] = np.rint(blend) if out.dtype.kind in "iu" else blend
    return out


def shift_slices_in_plane(array: np.ndarray, shifts: np.ndarray, fill: float) -> None:
    """Shift slice k by ``shifts[k]`` (rows, columns; pixels) in place, ``fill`` outside."""
    for k, shift in enumerate(shifts):
        if np.all(np.abs(shift) < 1e-3):
            continue
        moved = ndimage.shift(
            array[k].astype(np.float32), shift, order=1, mode="constant", cval=fill
        )
        array[k] = np.rint(moved) if array.dtype.kind in "iu" else moved
