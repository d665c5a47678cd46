"""Intensity normalisation exactly as a model's ``model.yaml`` declares it.

The formulas are the manifest's contract (``radserve.models.manifest``); training data
must be normalised by this function so the network sees the same numbers at inference.
"""

from __future__ import annotations

import numpy as np

from radserve.models.manifest import ClipZScore, CtWindow

__all__ = ["normalise", "normalised_floor"]


def normalise(array: np.ndarray, normalisation: CtWindow | ClipZScore) -> np.ndarray:
    """Return float32 intensities as the network expects them.

    ``ct_window``: clip to ``[center - width/2, center + width/2]`` and scale to ``[0, 1]``.
    ``clip_zscore``: clip to ``[lower, upper]`` then ``(x - mean) / std``.
    """
    out = np.array(array, dtype=np.float32, copy=True)
    if isinstance(normalisation, CtWindow):
        if normalisation.width <= 0:
            raise ValueError(f"ct_window width must be positive, got {normalisation.width}")
        lower = normalisation.center - normalisation.width / 2.0
        upper = normalisation.center + normalisation.width / 2.0
        np.clip(out, lower, upper, out=out)
        out -= np.float32(lower)
        out *= np.float32(1.0 / normalisation.width)
        return out
    if isinstance(normalisation, ClipZScore):
        np.clip(out, normalisation.lower, normalisation.upper, out=out)
        out -= np.float32(normalisation.mean)
        out *= np.float32(1.0 / normalisation.std)
        return out
    raise TypeError(f"unknown normalisation {type(normalisation).__name__}")


def normalised_floor(normalisation: CtWindow | ClipZScore) -> float:
    """The normalised value of the lowest clipped intensity (air in CT): the pad value."""
    if isinstance(normalisation, CtWindow):
        return 0.0
    return (normalisation.lower - normalisation.mean) / normalisation.std
