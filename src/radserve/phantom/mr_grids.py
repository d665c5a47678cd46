"""Where each MR sequence is acquired: its own grid in the CT's Frame of Reference.

Real multi-sequence MR rarely shares one grid: a 3D T1 at isotropic voxels, a T2 with
fine pixels and thick slices over a smaller field of view, a FLAIR with a slice gap,
tilted to an anatomical line, each with its own matrix and coverage. :data:`VARIED_GRIDS`
is such a set, sized for the small phantom (128 pixels of 2.5-3 mm, 5 mm slices): T1 3D
3.0 mm isotropic over the CT's whole volume (the reference; it divides the tests'
4 x 4 x 6 mm MONAI grids exactly, so model voxels land on T1 voxels), T2 1.6 x 1.6 mm pixels with
6 mm slices over 75% of the CT's field of view and coverage, FLAIR 2 mm pixels, 5 mm
slices 6 mm apart (a 1 mm gap), tilted 15 degrees about the left-right axis over 85% /
70%. :func:`acquisition_grid` places one (centred on the CT, same Frame of Reference) and
:func:`tissue_on_grid` samples the phantom's tissue classes at its voxel centres.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydicom.uid import generate_uid
from scipy.ndimage import affine_transform

from radserve.domain.volume import Volume
from radserve.phantom.anatomy import Tissue
from radserve.phantom.generate import Phantom

__all__ = [
    "VARIED_GRIDS",
    "MrGrid",
    "acquisition_grid",
    "second_frame_of_reference",
    "tissue_on_grid",
]


@dataclass(frozen=True)
class MrGrid:
    """One sequence's acquisition grid, relative to the CT it is drawn from.

    ``fov_fraction`` and ``coverage`` scale the CT's in-plane field of view and z extent;
    ``slice_mm`` is centre to centre (more than ``thickness_mm``: a gap); ``tilt_deg``
    turns the slices about the patient's left-right axis (an oblique axial).
    """

    pixel_mm: float
    slice_mm: float
    thickness_mm: float
    fov_fraction: float = 1.0
    coverage: float = 1.0
    tilt_deg: float = 0.0
    acquisition: str = "2D"  # MR Acquisition Type


VARIED_GRIDS: dict[str, MrGrid] = {
    "T1": MrGrid(3.0, 3.0, 3.0, acquisition="3D"),
    "T2": MrGrid(1.6, 6.0, 6.0, fov_fraction=0.75, coverage=0.75),
    "FLAIR": MrGrid(2.0, 6.0, 5.0, fov_fraction=0.85, coverage=0.7, tilt_deg=15.0),
}
"""The sequences on different grids (``radserve phantom --mr --mr-grids``)."""


def acquisition_grid(phantom: Phantom, grid: MrGrid) -> Volume:
    """An empty volume on ``grid``, centred on the CT, in its Frame of Reference."""
    ct = phantom.ct
    fov = ct.shape[2] * ct.spacing[2] * grid.fov_fraction
    extent_z = ct.shape[0] * ct.spacing[0] * grid.coverage
    matrix = max(1, round(fov / grid.pixel_mm))
    shape = np.array([max(1, round(extent_z / grid.slice_mm)), matrix, matrix])
    spacing = np.array([grid.slice_mm, grid.pixel_mm, grid.pixel_mm])
    c, s = math.cos(math.radians(grid.tilt_deg)), math.sin(math.radians(grid.tilt_deg))
    tilt = np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])  # about patient x (L-R)
    direction = tilt @ ct.direction
    centre = ct.index_to_patient((np.array(ct.shape, float) - 1.0) / 2.0)[0]
    origin = centre - direction @ ((shape - 1.0) / 2.0 * spacing)
    return Volume.from_geometry(
        np.zeros(tuple(int(n) for n in shape), np.float32),
        spacing=(grid.slice_mm, grid.pixel_mm, grid.pixel_mm),
        origin=(float(origin[0]), float(origin[1]), float(origin[2])),
        direction=direction,
        frame_of_reference_uid=ct.frame_of_reference_uid,
    )


def tissue_on_grid(phantom: Phantom, volume: Volume) -> np.ndarray:
    """The phantom's tissue class nearest each voxel centre of ``volume`` (air outside)."""
    to_ct = np.linalg.inv(phantom.ct.affine) @ volume.affine
    return affine_transform(
        phantom.tissue.array,
        to_ct[:3, :3],
        offset=to_ct[:3, 3],
        output_shape=volume.shape,
        order=0,
        mode="constant",
        cval=int(Tissue.AIR),
    )


def second_frame_of_reference(seed: int) -> str:
    """A Frame of Reference UID other than the phantom's: a sequence written in it is
    not registered to the others (``radserve phantom --mr --mr-second-frame``)."""
    return generate_uid(entropy_srcs=["radserve-phantom", str(seed), "second-frame-of-reference"])
