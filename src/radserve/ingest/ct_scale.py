"""The one bound on CT values, both ends, for every way a CT volume comes in.

A CT value outside int16's range (-32,768 to 32,767 HU) is on no CT scale (the extended
ones end near +30,700 HU; air is -1,000): the pixels were not read as they were written.
Before session 37 the DICOM path tested only the top, so a Rescale Intercept of -999,999
or a Rescale Slope of -1e5 made every voxel about -1e6 HU and the job "succeeded",
finding nothing; the NIfTI path tested both ends. One function now judges both paths
alike, with one code and one range named.
"""

from __future__ import annotations

import warnings

import numpy as np

from radserve.errors import StudyError

CT_MIN_HU = -32768
CT_MAX_HU = 32767
CODE = "implausible_pixel_values"


def ct_scale_problem(array: np.ndarray) -> tuple[float, float, int] | None:
    """(lowest, highest, how many voxels lie outside the CT scale), or None when every
    value lies on it. Infinity is off the scale; NaN is not judged (ignored)."""
    if not array.size or array.dtype.kind not in "iuf":
        return None
    if array.dtype.kind in "iu" and array.dtype.itemsize <= 2 and array.dtype != np.uint16:
        return None  # int8, uint8, int16 cannot leave the scale: no pass over the voxels
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: nothing to judge
        low, high = float(np.nanmin(array)), float(np.nanmax(array))
    if not (low < CT_MIN_HU or high > CT_MAX_HU):  # also true of an all-NaN volume
        return None
    outside = int(np.count_nonzero((array < CT_MIN_HU) | (array > CT_MAX_HU)))
    return low, high, outside


def check_ct_scale(array: np.ndarray, what: str, hint: str) -> None:
    """Refuse (``implausible_pixel_values``) a CT volume with values off the CT scale,
    naming the values' range, how many voxels and the scale; ``what`` names the input
    ("CT values", "NIfTI CT values"), ``hint`` says what likely went wrong."""
    found = ct_scale_problem(array)
    if found is None:
        return
    low, high, outside = found
    extreme = high if high > CT_MAX_HU else low
    raise StudyError(
        f"{what} reach {extreme:.0f} HU ({outside} of {array.size} voxels outside the CT "
        f"scale, {CT_MIN_HU} to {CT_MAX_HU} HU; values from {low:.0f} to {high:.0f}), "
        f"beyond any CT scale: {hint}",
        code=CODE,
    )


def declared_on_ct_scale(bits_stored: int, signed: bool, slope: float, intercept: float) -> bool:
    """Whether every stored value Bits Stored allows, rescaled, lies on the CT scale: a
    stack decoded while a reader already reads it (no check after the whole decode) must
    be on it by its header."""
    if signed:
        low, high = -(2 ** (bits_stored - 1)), 2 ** (bits_stored - 1) - 1
    else:
        low, high = 0, 2**bits_stored - 1
    ends = [v * slope + intercept for v in (low, high)]
    return min(ends) >= CT_MIN_HU and max(ends) <= CT_MAX_HU
