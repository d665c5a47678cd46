"""Where a CT study's fat reads, in HU: a check of the scanner's CT-number calibration
from the study itself.

A model trained on calibrated CTs sees a study shifted by a few tens of HU as another
contrast: the evaluation grid's ±40 HU cells lose a quarter of the lesions ≥ 10 mm one
way and add false positives both ways, with every header in the declared domain. No
header says a study is miscalibrated, but every chest or abdomen CT carries a
reference: body fat, a tissue whose CT number varies little between patients (about
-90 to -120 HU at 80-140 kVp). Its peak in the histogram is where the calibration puts
it.

Air outside the body would be the other natural reference (-1000 HU), but scanners
clip, pad and crop it differently (a -40 HU shift hides under a clip at -1024), so it is
not used.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import gaussian_filter1d

from radserve.domain.input_domain import FAT_SEARCH_HU
from radserve.domain.volume import Volume, spread_slices

_SMOOTH_HU = 4.0  # Gaussian smoothing of the 1 HU histogram
# Each pixel is measured as the mean of a block about 2.4 mm wide (3 x 3 at 0.78 mm): noise
# of 40 HU (a low-dose scan, 2.5x the phantoms') flattens a thin patient's fat peak into
# soft tissue's flank, and the mean cuts white noise by the block's side; a subcutaneous
# fat layer is several blocks thick. Coarse pixels (2.4 mm and more) are taken as they are.
_BLOCK_MM = 2.4
_SLICES = 48  # slices measured, evenly spaced: the peak needs no more, a study costs the same
# A peak counts when it stands this share of the window's voxels above its surroundings
# and holds this share of the body's blocks within _PEAK_HU of its top: noise has small
# peaks of its own (a water phantom has no fat, and must not be given any); a lean
# patient's fat is still several per cent of the body.
_MIN_PROMINENCE = 0.002
_MIN_BODY_SHARE = 0.01
_PEAK_HU = 15
_BODY_HU = -500.0
_MIN_VOXELS = 500


def _body_block_means(plane: np.ndarray, side: int) -> np.ndarray:
    """Means of the ``side`` x ``side`` blocks that lie wholly in tissue (every pixel
    above -500 HU), summed by strided views (a reshape's ``sum(axis=(1, 3))`` costs nine
    times as much on a 512 x 512 slice). A block astride the skin or a lung's edge is
    left out: its mean is a mixture with air (a hard edge makes the mixtures 1/9, 2/9...
    of air, each a false peak of its own)."""
    if side == 1:
        values = np.asarray(plane, np.float32)
        return values[values > _BODY_HU]
    rows, cols = (plane.shape[0] // side) * side, (plane.shape[1] // side) * side
    wide = np.int32 if np.issubdtype(plane.dtype, np.integer) else np.float64
    whole = np.asarray(plane[:rows, :cols], wide)
    row_sums, row_mins = whole[0::side].copy(), whole[0::side].copy()
    for k in range(1, side):
        row_sums += whole[k::side]
        np.minimum(row_mins, whole[k::side], out=row_mins)
    sums, mins = row_sums[:, 0::side].copy(), row_mins[:, 0::side].copy()
    for k in range(1, side):
        sums += row_sums[:, k::side]
        np.minimum(mins, row_mins[:, k::side], out=mins)
    return sums[mins > _BODY_HU] / float(side * side)


def _most_prominent_peak(y: np.ndarray, min_prominence: float) -> int | None:
    """The index of the local maximum of ``y`` that stands highest above its
    surroundings (prominence: its height above the higher of the lowest points between
    it and the nearest higher value on each side, or the end), if at least
    ``min_prominence``. ``scipy.signal.find_peaks`` computes the same, but importing
    scipy.signal loads scipy.spatial and more into every worker for 240 numbers."""
    inner = np.flatnonzero((y[1:-1] > y[:-2]) & (y[1:-1] >= y[2:])) + 1
    best, best_prominence = None, min_prominence
    for i in inner:
        bases = []
        for side in (y[:i][::-1], y[i + 1 :]):
            higher = np.flatnonzero(side > y[i])
            bases.append(side[: higher[0]].min() if higher.size else side.min())
        prominence = float(y[i] - max(bases))
        if prominence >= best_prominence:
            best, best_prominence = int(i), prominence
    return best


def fat_peak_hu(volume: Volume) -> float | None:
    """The CT number of the body's fat (its histogram peak in :data:`FAT_SEARCH_HU`, to
    1 HU), or None when the study shows no such peak (a head, a water phantom, a
    volume that is not CT).

    The most prominent peak of the smoothed histogram inside the window is taken, not
    the window's maximum: soft tissue's noisy flank rises towards the window's top edge
    and can outnumber a thin patient's fat there, but it has no peak inside. Slices are
    measured one at a time (no volume-sized temporary).
    """
    lo, hi = FAT_SEARCH_HU
    array = volume.array
    side = max(1, round(_BLOCK_MM / max(volume.spacing[1], volume.spacing[2])))
    counts = np.zeros(hi - lo + 1, np.int64)
    body = 0
    for z in spread_slices(array.shape[0], _SLICES):
        means = _body_block_means(array[z], side)
        body += means.size
        inside = means[(means >= lo - 0.5) & (means < hi + 0.5)]
        counts += np.bincount(np.rint(inside - lo).astype(np.intp), minlength=counts.size)
    total = int(counts.sum())
    if total < _MIN_VOXELS:
        return None
    smooth = gaussian_filter1d(counts.astype(np.float64), _SMOOTH_HU, mode="nearest")
    best = _most_prominent_peak(smooth, _MIN_PROMINENCE * total)
    if best is None:
        return None
    if counts[max(0, best - _PEAK_HU) : best + _PEAK_HU + 1].sum() < _MIN_BODY_SHARE * body:
        return None
    return float(lo + best)


__all__ = ["FAT_SEARCH_HU", "fat_peak_hu"]
