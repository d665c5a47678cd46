"""Intensity normalisation exactly as a model's ``model.yaml`` declares it.

The formulas are the manifest's contract (``radserve.models.manifest``); training data
must be normalised by this function so the network sees the same numbers at inference.
The per-image kinds (``zscore``, ``rescale_01``) repeat nnU-Net's float32 arithmetic
step by step (``nnunetv2.preprocessing.normalization``), so an imported model sees the
numbers its own preprocessor would give it.
"""

from __future__ import annotations

import numpy as np

from radserve.models.manifest import (
    ClipZScore,
    CtWindow,
    MonaiIntensity,
    MonaiIntensityStep,
    NoNormalisation,
    Normalisation,
    RescaleUnit,
    ZScore,
)

__all__ = ["normalise", "normalised_floor"]

_EPS = 1e-8  # nnU-Net's epsilon for float32 targets


def normalise(
    array: np.ndarray, normalisation: Normalisation, mask: np.ndarray | None = None
) -> np.ndarray:
    """Return float32 intensities as the network expects them.

    ``ct_window``: clip to ``[center - width/2, center + width/2]`` and scale to ``[0, 1]``.
    ``clip_zscore``: clip to ``[lower, upper]`` then ``(x - mean) / std``.
    ``zscore``: ``(x - mean) / max(std, 1e-8)`` of ``array`` itself; with ``use_mask``
    of the voxels of ``mask`` (nnU-Net's non-zero mask, required), the others untouched.
    ``rescale_01``: ``x - min``, divided by ``max(max, 1e-8)`` of that; ``monai_intensity``:
    MONAI's ``NormalizeIntensity`` / ``ScaleIntensity`` steps in order (``mask``: the
    first step's non-zero voxels, where given); ``none``: float32.
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
    if isinstance(normalisation, ZScore):
        return _zscore(out, mask if normalisation.use_mask else None, normalisation.use_mask)
    if isinstance(normalisation, RescaleUnit):
        if out.size:
            out -= out.min()
            out /= np.clip(out.max(), _EPS, None)
        return out
    if isinstance(normalisation, MonaiIntensity):
        for i, step in enumerate(normalisation.steps):
            out = _monai_step(out, step, mask if i == 0 else None)
        return out
    if isinstance(normalisation, NoNormalisation):
        return out
    raise TypeError(f"unknown normalisation {type(normalisation).__name__}")


def _zscore(out: np.ndarray, mask: np.ndarray | None, use_mask: bool) -> np.ndarray:
    """nnU-Net's ``ZScoreNormalization.run`` on a float32 copy."""
    if use_mask:
        if mask is None or mask.shape != out.shape:
            raise ValueError(
                "zscore with use_mask needs the non-zero mask of the image's shape "
                f"{out.shape}, got {None if mask is None else mask.shape}"
            )
        if mask.any():
            inside = out[mask]
            mean, std = inside.mean(), inside.std()
            out[mask] = (inside - mean) / max(std, _EPS)
        return out
    if out.size:
        mean, std = out.mean(), out.std()
        out -= mean
        out /= max(std, _EPS)
    return out


def _monai_step(
    out: np.ndarray, step: MonaiIntensityStep, support: np.ndarray | None = None
) -> np.ndarray:
    """MONAI 1.6's ``NormalizeIntensity`` (float32, population std, a std of 0 -> 1) or
    ``rescale_array`` (``ScaleIntensity(minv, maxv)``; a constant image -> ``x * minv``).
    ``support``: the voxels ``nonzero`` counts as non-zero where ``out != 0`` would
    follow rounding (after a resampling, see ``inference.patches._monai_support``)."""
    if not out.size:
        return out
    if step.op == "scale":
        lo, hi = out.min(), out.max()
        if lo == hi:
            out *= np.float32(step.minv)
            return out
        out -= lo
        out /= hi - lo
        out *= np.float32(step.maxv - step.minv)
        out += np.float32(step.minv)
        return out
    region = (out != 0 if support is None else support) if step.nonzero else None
    values = out[region] if region is not None else out
    if not values.size:
        return out
    mean, std = values.mean(dtype=np.float64), values.std(dtype=np.float64)
    mean, std = np.float32(mean), np.float32(std) if std != 0 else np.float32(1.0)
    if region is None:
        out -= mean
        out /= std
    else:
        out[region] = (values - mean) / std
    return out


def normalised_floor(normalisation: Normalisation) -> float:
    """The normalised value of the lowest clipped intensity (air in CT): the pad value.

    The per-image kinds and ``none`` have no fixed floor: they pad with 0 (nnU-Net
    pads its normalised crop with 0 whatever the scheme)."""
    if isinstance(normalisation, CtWindow):
        return 0.0
    if isinstance(normalisation, ClipZScore):
        return (normalisation.lower - normalisation.mean) / normalisation.std
    return 0.0
