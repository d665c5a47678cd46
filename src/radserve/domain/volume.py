"""Voxels plus the geometry that places them in the patient.

Mirrors ``highdicom.Volume``: ``array`` is indexed (slice, row, column) and ``affine``
maps those indices, in that order, to DICOM patient coordinates (LPS, millimetres).
Column 0 of the affine is the step between slices, column 1 the step between rows
(Pixel Spacing[0] times the IOP column direction), column 2 the step between columns
(Pixel Spacing[1] times the IOP row direction). Geometry is derived only here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# NIfTI world space is RAS; DICOM patient space is LPS.
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def spread_slices(n_slices: int, count: int) -> list[int]:
    """At most ``count`` slice indices spread evenly from the first to the last: a
    measurement of the whole study that costs the same whatever its length."""
    return [int(z) for z in np.unique(np.linspace(0, n_slices - 1, min(count, n_slices)).round())]


def spacing_of(affine: np.ndarray) -> tuple[float, float, float]:
    """Voxel size in mm along (slice, row, column) of an index-to-patient affine."""
    norms = np.linalg.norm(np.asarray(affine, dtype=np.float64)[:3, :3], axis=0)
    return (float(norms[0]), float(norms[1]), float(norms[2]))


@dataclass(frozen=True, eq=False)
class Volume:
    """An image or label volume in patient space; operations return new volumes."""

    array: np.ndarray
    affine: np.ndarray
    frame_of_reference_uid: str | None = None
    source_sop_instance_uids: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.array.ndim != 3:
            raise ValueError(
                f"Volume array must be 3-D (slice, row, column), got {self.array.shape}"
            )
        affine = np.asarray(self.affine, dtype=np.float64)
        if affine.shape != (4, 4):
            raise ValueError(f"Volume affine must be 4x4, got {affine.shape}")
        object.__setattr__(self, "affine", affine)
        if self.source_sop_instance_uids and len(self.source_sop_instance_uids) != self.shape[0]:
            raise ValueError(
                f"{len(self.source_sop_instance_uids)} source instance UIDs for "
                f"{self.shape[0]} slices"
            )

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_geometry(
        cls,
        array: np.ndarray,
        *,
        spacing: tuple[float, float, float],
        origin: tuple[float, float, float] = (0.0, 0.0, 0.0),
        direction: np.ndarray | None = None,
        frame_of_reference_uid: str | None = None,
        source_sop_instance_uids: tuple[str, ...] = (),
    ) -> Volume:
        """Build from (slice, row, column) spacing, the first voxel's centre and unit axes.

        ``direction`` has the unit vectors of the slice, row and column axes as columns;
        the default is a standard axial stack (slices towards head, rows towards
        posterior, columns towards patient left).
        """
        direction = np.eye(3)[:, ::-1] if direction is None else np.asarray(direction, float)
        affine = np.eye(4)
        affine[:3, :3] = direction * np.asarray(spacing, float)[None, :]
        affine[:3, 3] = origin
        return cls(array, affine, frame_of_reference_uid, source_sop_instance_uids)

    def with_array(self, array: np.ndarray) -> Volume:
        """Same geometry, other voxels (a label map, probabilities, a normalised image)."""
        if array.shape[:3] != self.shape:
            raise ValueError(f"shape {array.shape} does not match volume shape {self.shape}")
        return Volume(
            array, self.affine, self.frame_of_reference_uid, self.source_sop_instance_uids
        )

    # --- geometry -----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(n) for n in self.array.shape[:3])  # type: ignore[return-value]

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size in mm along (slice, row, column)."""
        return spacing_of(self.affine)

    @property
    def origin(self) -> np.ndarray:
        """Patient position (LPS mm) of the centre of voxel (0, 0, 0)."""
        return self.affine[:3, 3].copy()

    @property
    def direction(self) -> np.ndarray:
        """Unit vectors of the slice, row and column axes (as columns)."""
        return self.affine[:3, :3] / np.asarray(self.spacing)[None, :]

    @property
    def voxel_volume_ml(self) -> float:
        return float(abs(np.linalg.det(self.affine[:3, :3])) / 1000.0)

    def index_to_patient(self, indices: np.ndarray) -> np.ndarray:
        """(N, 3) voxel indices (slice, row, column) -> (N, 3) LPS millimetres."""
        idx = np.atleast_2d(np.asarray(indices, dtype=np.float64))
        return idx @ self.affine[:3, :3].T + self.affine[:3, 3]

    def patient_to_index(self, points: np.ndarray) -> np.ndarray:
        """(N, 3) LPS millimetres -> (N, 3) fractional voxel indices."""
        pts = np.atleast_2d(np.asarray(points, dtype=np.float64))
        return (pts - self.affine[:3, 3]) @ np.linalg.inv(self.affine[:3, :3]).T

    def same_geometry(self, other: Volume, tol: float = 1e-3) -> bool:
        return self.shape == other.shape and bool(np.allclose(self.affine, other.affine, atol=tol))

    # --- NIfTI convention ---------------------------------------------------------------
    def nifti_affine(self) -> np.ndarray:
        """Affine for the array transposed to (column, row, slice) = NIfTI (i, j, k), in RAS."""
        reorder = np.zeros((4, 4))
        reorder[0, 2] = reorder[1, 1] = reorder[2, 0] = reorder[3, 3] = 1.0
        return LPS_TO_RAS @ self.affine @ reorder

    @classmethod
    def from_nifti_arrays(cls, data_ijk: np.ndarray, nifti_affine: np.ndarray) -> Volume:
        """Inverse of :meth:`nifti_affine`: NIfTI (i, j, k) data and RAS affine -> Volume."""
        reorder = np.zeros((4, 4))
        reorder[0, 2] = reorder[1, 1] = reorder[2, 0] = reorder[3, 3] = 1.0
        affine = LPS_TO_RAS @ np.asarray(nifti_affine, float) @ reorder
        return cls(np.ascontiguousarray(np.transpose(data_ijk, (2, 1, 0))), affine)
