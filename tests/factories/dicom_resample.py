"""One DICOM series onto another's grid, computed in the test from the files' own headers.

The check radserve's channel resampling (``radserve.preprocess.onto_grid``) is held to:
each series' index -> patient matrix from Image Position / Orientation (Patient) and
Pixel Spacing (slices sorted along the normal, spacing from the first and last
positions), the reference voxel centres mapped into the source's indices, and
``scipy.ndimage.map_coordinates`` of the given spline order there (edge values repeated
within the last half voxel, 0 outside the source's imaged volume). None of radserve's
geometry code is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
from scipy.ndimage import map_coordinates


@dataclass(frozen=True)
class DicomGrid:
    """A series read with pydicom: (slice, row, column) pixels and index -> patient (LPS)."""

    array: np.ndarray
    affine: np.ndarray


def read_grid(files: list[Path]) -> DicomGrid:
    """Pixels and geometry of one single-frame series, straight from its headers."""
    datasets = [pydicom.dcmread(f) for f in files]
    iop = np.array(datasets[0].ImageOrientationPatient, float)
    along_row, along_column = iop[:3], iop[3:]  # column index i, row index j
    normal = np.cross(along_row, along_column)
    datasets.sort(key=lambda d: float(normal @ np.array(d.ImagePositionPatient, float)))
    ipp = np.array([d.ImagePositionPatient for d in datasets], float)
    row_mm, column_mm = (float(v) for v in datasets[0].PixelSpacing)
    affine = np.eye(4)
    affine[:3, 0] = (ipp[-1] - ipp[0]) / max(1, len(datasets) - 1)
    affine[:3, 1] = along_column * row_mm
    affine[:3, 2] = along_row * column_mm
    affine[:3, 3] = ipp[0]
    pixels = [d.pixel_array.astype(np.float64) * float(getattr(d, "RescaleSlope", 1) or 1)
              + float(getattr(d, "RescaleIntercept", 0) or 0) for d in datasets]  # fmt: skip
    return DicomGrid(np.stack(pixels), affine)


def onto(
    source: DicomGrid, reference: DicomGrid, order: int, nudge: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """``source`` at ``reference``'s voxel centres (float64) and the covered-voxel mask;
    ``nudge`` (source voxels, every axis) tips nearest-neighbour ties one way."""
    shape = reference.array.shape
    index = np.indices(shape, dtype=np.float64).reshape(3, -1)
    patient = reference.affine[:3, :3] @ index + reference.affine[:3, 3:]
    at = np.linalg.solve(source.affine[:3, :3], patient - source.affine[:3, 3:]) + nudge
    # a voxel centre on a source voxel centre (a 3 mm grid over 6 mm slices) is exactly
    # there: without this a 1e-13 share of the body leaks into air, and a non-zero mask
    # (nnU-Net's, MONAI's NormalizeIntensity(nonzero)) takes that voxel in
    whole = np.rint(at)
    at = np.where(np.abs(at - whole) < 1e-9, whole, at)
    n = np.array(source.array.shape, float)[:, None]
    inside = np.all((at >= -0.5 - 1e-6) & (at <= n - 0.5 + 1e-6), axis=0)
    values = map_coordinates(source.array, at, order=order, mode="nearest")
    values[~inside] = 0.0
    return values.reshape(shape), inside.reshape(shape)
