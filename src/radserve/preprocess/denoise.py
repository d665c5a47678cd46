"""Image ops a model declares before inference (``preprocess:`` in model.yaml).

Both are in-plane (each slice on its own, the z axis untouched), so the 2D/2.5D tasks
can apply them to the slices a batch reads, and run on the native HU crop before
resampling and normalisation. The crop is read with a margin of the filter's reach and
trimmed after, so the result inside the crop is exactly that of filtering whole slices
(scipy's ``nearest`` border only at the volume's own edges). Nothing runs, and nothing
is copied, when a model declares no op.

Cost (CPU time of the op alone, one thread, 512 x 512 x 300 int16 study, measured once;
see docs/model-ops.md): ``median`` size 3 about 0.6-0.9 s, ``gaussian`` sigma 1 mm
about 0.8-1.1 s: paid only by a model that declares them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import ndimage

from radserve.models.ops import Gaussian, Median

ImageOp = Median | Gaussian


def reach(op: ImageOp, spacing_yx: tuple[float, float]) -> tuple[int, int]:
    """Pixels each side (rows, columns) one output pixel depends on."""
    if isinstance(op, Median):
        return (op.reach, op.reach)
    # scipy's gaussian_filter truncates at 4 sigma.
    return tuple(int(4.0 * op.sigma_mm / s + 0.5) for s in spacing_yx)  # type: ignore[return-value]


def apply_image_ops(
    slices: np.ndarray, ops: Sequence[ImageOp], spacing_yx: tuple[float, float]
) -> np.ndarray:
    """``slices`` (z, y, x) with every op applied in-plane, in order (dtype kept for the
    median, float32 after a gaussian)."""
    out = slices
    for op in ops:
        if isinstance(op, Median) and op.size == 3:
            out = _median3(out)
        elif isinstance(op, Median):
            out = ndimage.median_filter(out, size=(1, op.size, op.size), mode="nearest")
        else:
            sigma = (0.0, op.sigma_mm / spacing_yx[0], op.sigma_mm / spacing_yx[1])
            out = ndimage.gaussian_filter(out.astype(np.float32), sigma, mode="nearest")
    return out


# Devillard's opt_med9: 19 compare-exchanges leave the median of nine values in p[4].
_MED9 = ((1, 2), (4, 5), (7, 8), (0, 1), (3, 4), (6, 7), (1, 2), (4, 5), (7, 8), (0, 3),
         (5, 8), (4, 7), (3, 6), (1, 4), (2, 5), (4, 7), (4, 2), (6, 4), (4, 2))  # fmt: skip


_MEDIAN_SLAB = 2


def _median3(slices: np.ndarray) -> np.ndarray:
    """3 x 3 in-plane median, equal to ``median_filter(size=(1, 3, 3), mode="nearest")``:
    a sorting network of element-wise min/max over the nine shifted views, about 5x
    faster than scipy's generic selection on CT slices."""
    out = np.empty_like(slices)
    h, w = slices.shape[1:]
    for z in range(0, len(slices), _MEDIAN_SLAB):  # a few slices at a time: in cache
        padded = np.pad(slices[z : z + _MEDIAN_SLAB], ((0, 0), (1, 1), (1, 1)), mode="edge")
        p = [padded[:, dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)]
        for i, j in _MED9:
            p[i], p[j] = np.minimum(p[i], p[j]), np.maximum(p[i], p[j])
        out[z : z + _MEDIAN_SLAB] = p[4]
    return out


def read_filtered(
    array: np.ndarray,
    box: tuple[slice, slice, slice],
    ops: Sequence[ImageOp],
    spacing_yx: tuple[float, float],
) -> np.ndarray:
    """``array[box]`` after the ops, computed from the box grown in-plane by the ops'
    reach (so the crop's border pixels see their true neighbours). Without ops: the
    plain view."""
    if not ops:
        return array[box]
    zs, ys, xs = box
    ry = sum(reach(op, spacing_yx)[0] for op in ops)
    rx = sum(reach(op, spacing_yx)[1] for op in ops)
    y0, y1 = max(0, ys.start - ry), min(array.shape[1], ys.stop + ry)
    x0, x1 = max(0, xs.start - rx), min(array.shape[2], xs.stop + rx)
    grown = apply_image_ops(array[zs, y0:y1, x0:x1], ops, spacing_yx)
    return grown[:, ys.start - y0 : ys.stop - y0, xs.start - x0 : xs.stop - x0]
