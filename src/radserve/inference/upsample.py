"""Labels of bilinearly upsampled class probabilities, interpolating only at boundaries.

A 2D/2.5D model's class probabilities live on the model grid (e.g. 1.5 mm); the labels
are wanted on the native grid (e.g. 0.7 mm). The plain way interpolates every class
onto every native pixel, then takes the winner: for a ten-class organ model that was
the largest single cost of the whole pipeline after the networks themselves.

Each native pixel's interpolated probabilities are a convex combination of the four
model-grid pixels around it (two rows, two columns; weights >= 0, summing to 1). If
those four pixels share their winning class ``c`` (first class wins ties, as in
:func:`radserve.inference.tasks.decide`), then ``c`` also wins the combination:
``p[c] >= p[d]`` at every corner gives ``sum w p[c] >= sum w p[d]``, and strictly for
``d < c``. The winner's interpolated probability is then the interpolated *maximum*
probability, one channel instead of all. Only pixels whose corners disagree need
every class interpolated, and there the arithmetic is the same float32 operations, in
the same order, as :func:`radserve.preprocess.resample.interpolate_axis` along rows and
then columns, so the result is that of the plain way. (Where two classes are within a
float32 rounding of each other at every corner, rounding in the plain way could pick
either; both are the same answer.)

Sigmoid models work the same way: the most probable label is decided like a softmax
winner, and the threshold is applied to the interpolated maximum.
"""

from __future__ import annotations

import numpy as np

from radserve.inference.tasks import finish_decision, refuse_nan, running_winner
from radserve.models.manifest import ModelSpec
from radserve.preprocess.resample import interpolate_axis

__all__ = ["UpsampledDecision"]


class _Axis:
    """Lower/upper source index and float32 weight per output position (one axis)."""

    def __init__(self, coords: np.ndarray, n_in: int) -> None:
        self.coords = coords
        c = np.clip(coords, 0.0, n_in - 1)
        self.i0 = np.floor(c).astype(np.intp)
        w = c - self.i0
        # A zero weight reads only the lower sample; pointing the upper one at it too
        # keeps exact grid points (and axes that are not resampled) from counting as
        # boundaries.
        self.i1 = np.where(w > 0, np.minimum(self.i0 + 1, n_in - 1), self.i0)
        self.w = w.astype(np.float32)


class UpsampledDecision:
    """``decide(interpolate(probs))`` for one (rows, columns) mapping, done sparsely.

    ``coords_y``/``coords_x`` are the fractional model-grid indices each native row and
    column samples (:func:`radserve.preprocess.resample.grid_coordinates`).
    """

    def __init__(
        self, coords_y: np.ndarray, n_in_y: int, coords_x: np.ndarray, n_in_x: int
    ) -> None:
        self._y = _Axis(coords_y, n_in_y)
        self._x = _Axis(coords_x, n_in_x)
        self.boundary_fraction = 0.0  # of the last call's pixels, for tests and tuning

    def __call__(
        self, probs: np.ndarray, spec: ModelSpec, *, confidence: bool = True
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(classes, rows, cols) float32 probabilities -> native (uint8 labels, confidence).

        ``confidence=False``: a softmax model's confidence map is not wanted (organ
        models), so the winner's probability is not interpolated and ``None`` returned.
        """
        y, x = self._y, self._x
        winner, best = running_winner(probs)
        refuse_nan(spec, best)  # every voxel below reads these samples
        # A model-grid cell (samples i..i+1, j..j+1; the edge replicated past the last
        # row and column, where interpolation reads only the edge) is split when its
        # four samples do not share the winner. Every native pixel reads the samples of
        # the cell at its lower corner (or a subset of them, at zero weight).
        split = _split_cells(winner)
        # np.take: C-ordered results (``a[:, idx]`` need not be), so the flat views below
        # write into them.
        labels = np.take(winner[y.i0], x.i0, axis=1)
        at_split = np.take(split[y.i0], x.i0, axis=1)
        boundary = np.flatnonzero(at_split)
        self.boundary_fraction = boundary.size / max(1, at_split.size)
        rr, cc = np.divmod(boundary, at_split.shape[1])
        at_boundary = self._interpolate_at(probs, rr, cc) if boundary.size else None
        flat_labels = labels.reshape(-1)
        if not confidence and spec.activation == "softmax":
            if at_boundary is not None:
                flat_labels[boundary] = running_winner(at_boundary)[0]
            return labels, None
        # The winner's interpolated probability where the corners agree.
        best = interpolate_axis(best, 0, y.coords, order=1)
        best = interpolate_axis(best, 1, x.coords, order=1)
        if at_boundary is not None:
            flat_labels[boundary], best.reshape(-1)[boundary] = running_winner(at_boundary)
        return finish_decision(labels, best, spec)

    def _interpolate_at(self, probs: np.ndarray, rr: np.ndarray, cc: np.ndarray) -> np.ndarray:
        """(classes, n) probabilities at native pixels (rr, cc), as interpolate_axis does."""
        y, x = self._y, self._x
        width = probs.shape[2]
        # Flat indices into each class plane: one np.take per corner reads the same
        # samples as ``probs[:, r, c]``, without numpy's broadcast fancy indexing.
        flat = np.ascontiguousarray(probs).reshape(probs.shape[0], -1)
        r0, r1, wy = y.i0[rr] * width, y.i1[rr] * width, y.w[rr]
        c0, c1, wx = x.i0[cc], x.i1[cc], x.w[cc]

        def along_rows(col: np.ndarray) -> np.ndarray:
            lo = np.take(flat, r0 + col, axis=1)
            hi = np.take(flat, r1 + col, axis=1)
            hi -= lo
            hi *= wy
            hi += lo
            return hi

        left = along_rows(c0)
        right = along_rows(c1)
        right -= left
        right *= wx
        right += left
        return right


def _split_cells(winner: np.ndarray) -> np.ndarray:
    """Per model-grid cell (samples i..i+1, j..j+1, the last row and column repeated
    past the edge): True where its four samples do not all have the same winner.

    The same answer as comparing the corners of ``np.pad(winner, 1, mode="edge")``,
    without np.pad's per-call overhead (it ran twice per slice, 300 times a study)."""
    h, w = winner.shape
    edged = np.empty((h + 1, w + 1), winner.dtype)
    edged[:h, :w] = winner
    edged[h, :w] = winner[h - 1]
    edged[:, w] = edged[:, w - 1]
    corner = edged[:-1, :-1]
    split = corner != edged[1:, :-1]
    split |= corner != edged[:-1, 1:]
    split |= corner != edged[1:, 1:]
    return split
