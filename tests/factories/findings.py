"""Synthetic label maps with known geometry for post-processing and report tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from radserve.domain import Prediction, Volume
from radserve.models.manifest import ModelSpec

_NORM = {"kind": "ct_window", "center": 40, "width": 400}


def label(value: int, name: str, kind: str = "organ", **extra: Any) -> dict[str, Any]:
    return {
        "value": value,
        "name": name,
        "kind": kind,
        "concept": {"value": f"9{value}", "meaning": name},
        "category": {"value": "49755003" if kind == "lesion" else "123037004", "meaning": "x"},
        **extra,
    }


def spec(
    labels: list[dict[str, Any]], modality: str = "CT", name: str = "m", **postprocess: Any
) -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": name,
            "version": "1.0",
            "task": "segmentation",
            "modality": modality,
            "input": {"mode": "2d", "spacing": (None, 1.0, 1.0), "normalisation": _NORM},
            "labels": labels,
            "postprocess": postprocess,
        }
    )


def ellipsoid(
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    centre: tuple[float, float, float],
    radii_mm: tuple[float, float, float],
) -> np.ndarray:
    """Voxels whose centre lies inside an axis-aligned ellipsoid (centre in voxel units)."""
    z, y, x = np.ogrid[: shape[0], : shape[1], : shape[2]]
    d = sum(
        ((g - c) * s / r) ** 2
        for g, c, s, r in zip((z, y, x), centre, spacing, radii_mm, strict=True)
    )
    return d <= 1.0


def oblique_affine(spacing: tuple[float, float, float], degrees: float = 20.0) -> np.ndarray:
    """A flipped (slices towards feet) and in-plane rotated axial stack."""
    a = np.deg2rad(degrees)
    col = np.array([np.cos(a), np.sin(a), 0.0])  # mostly patient left
    row = np.array([-np.sin(a), np.cos(a), 0.0])  # mostly posterior
    slc = np.array([0.0, 0.0, -1.0])  # towards feet
    affine = np.eye(4)
    affine[:3, :3] = np.column_stack([slc, row, col]) * np.asarray(spacing)[None, :]
    affine[:3, 3] = (-120.0, 35.0, 410.0)
    return affine


def prediction(
    labels: np.ndarray, affine: np.ndarray, confidence: np.ndarray | None = None
) -> Prediction:
    grid = Volume(labels.astype(np.uint8), affine)
    conf = None if confidence is None else grid.with_array(confidence.astype(np.uint8))
    return Prediction("lesions", "1.0", "fp32", grid, conf)
