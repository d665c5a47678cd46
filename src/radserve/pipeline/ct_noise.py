"""How noisy a CT study is, in HU, from its own pixels: the robust spread of the
differences between neighbouring soft-tissue pixels.

A model trained on one dose level sees a much noisier study (a low-dose protocol, a
large patient) as texture it never learned: on the evaluation grid the lesion model
keeps every lesion at 4x and 6x the phantoms' noise but reports 2 and 71 false findings
per study, with every header inside its declared domain. No header states the noise a
study ended up with, so it is measured.

Two pixels side by side in the same tissue differ by their noise (the anatomy changes
little over one pixel); the median absolute deviation of those differences, scaled to a
standard deviation (x 1.4826) and divided by sqrt(2) (a difference of two), is the noise
of one pixel, and the median leaves out the pairs astride an organ's edge. Measured on
pixels between -150 and 250 HU (soft tissue, blood, contrast-enhanced organs; not fat,
lung, air or bone). A reconstruction kernel that smooths makes neighbours alike, so a
real study reads lower on this scale than its noise measured in a region of interest;
the phantoms' noise is white.
"""

from __future__ import annotations

import numpy as np

from radserve.domain.input_domain import SOFT_TISSUE_HU
from radserve.domain.volume import Volume, spread_slices

# slices measured, evenly spaced, and every other row of each: millions of pixel pairs, a
# study costs the same whatever its length (~25 ms at 512 x 512)
_SLICES = 24
_MIN_PAIRS = 100
_MAD_TO_SD = 1.4826


def noise_hu(volume: Volume | np.ndarray) -> float | None:
    """The study's pixel noise (HU, one standard deviation), or None when it has fewer
    than 100 neighbouring soft-tissue pixel pairs (no body in view)."""
    array = np.asarray(volume.array if isinstance(volume, Volume) else volume)
    if array.ndim != 3 or array.shape[2] < 2:
        return None
    lo, hi = SOFT_TISSUE_HU
    parts = []
    for k in spread_slices(array.shape[0], _SLICES):
        plane = array[k, ::2]
        soft = (plane >= lo) & (plane <= hi)
        pair = soft[:, 1:] & soft[:, :-1]
        parts.append(plane[:, 1:][pair].astype(np.float32) - plane[:, :-1][pair])
    diffs = np.concatenate(parts) if parts else np.empty(0, np.float32)
    if diffs.size < _MIN_PAIRS:
        return None
    deviation = np.median(np.abs(diffs - np.median(diffs)))
    return float(_MAD_TO_SD * deviation / np.sqrt(2.0))


__all__ = ["SOFT_TISSUE_HU", "noise_hu"]
