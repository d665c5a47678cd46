"""What a phantom study looks like: every variation is drawn from one integer seed.

The spec holds the acquisition (grid, spacing, noise) and the patient-level variation
(size, position, lesion count). Organ-level shape variation is drawn inside the
anatomy builder from the same seed, so ``dataclasses.replace`` on acquisition fields
keeps the patient's anatomy unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from radserve.domain.volume import Volume

# Label values of the organ map; clinical organ masks include lesions and vessels inside.
ORGAN_LABELS: dict[str, int] = {
    "liver": 1,
    "spleen": 2,
    "kidney_left": 3,
    "kidney_right": 4,
    "lung_left": 5,
    "lung_right": 6,
    "heart": 7,
    "aorta": 8,
    "spine": 9,
    "ribs": 10,
}
ORGAN_NAMES: dict[int, str] = {v: k for k, v in ORGAN_LABELS.items()}

# Body-frame z (mm, patient scale 1) spanned by the anatomy: kidney lower pole to lung apex.
ANATOMY_Z_RANGE: tuple[float, float] = (-185.0, 195.0)

_FULL_SLICE_SPACINGS = (0.625, 0.75, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 5.0)
_MIN_SLICES, _MAX_SLICES = 100, 500
# Widest body half-width in the body frame (mm) times the largest contour modulation.
_MAX_BODY_HALF_WIDTH = 159.0 * 1.05


def _rng(seed: int, stream: int) -> np.random.Generator:
    """Independent random stream per concern, so overriding one field keeps the rest."""
    return np.random.default_rng([seed, stream])


@dataclass(frozen=True)
class PhantomSpec:
    """Acquisition and patient parameters of one synthetic CT study.

    Geometry: an axial stack; slice ``k`` lies at z = ``first_slice_z_mm + k *
    slice_spacing_mm`` (slices go towards the head), rows go towards posterior (+y),
    columns towards patient left (+x), all in DICOM LPS millimetres. The in-plane
    field of view is centred on x = y = 0.
    """

    seed: int
    small: bool = False
    rows: int = 512
    columns: int = 512
    n_slices: int = 300
    pixel_spacing_mm: float = 0.75
    slice_spacing_mm: float = 1.25
    slice_thickness_mm: float = 1.25
    first_slice_z_mm: float = -200.0
    # Patient: overall size factor, in-plane position of the body centre (x lateral,
    # y = table height), patient z of the anatomy's reference plane (diaphragm dome)
    # and a z compression of the anatomy (1.0 except for small phantoms).
    patient_scale: float = 1.0
    patient_offset_mm: tuple[float, float] = (0.0, 0.0)
    anatomy_z_mm: float = 0.0
    anatomy_z_scale: float = 1.0
    noise_sigma_hu: float = 15.0
    blur_sigma_px: float = 0.6
    n_lesions: int = 3
    with_table: bool = True
    # Upper bound (mm) on drawn lesion diameters; None keeps each kind's own range. For
    # training sets rich in small lesions: the draws themselves (and so everything else
    # a seed gives) are unchanged, only the diameter range shrinks.
    lesion_max_diameter_mm: float | None = None
    # Contrast medium: 1 draws the portal-venous phase (the training data), 0 a
    # non-contrast CT, between them a weaker enhancement (anatomy.NATIVE_HU).
    contrast_enhancement: float = 1.0

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"PhantomSpec.seed must be >= 0, got {self.seed}")
        for name in ("rows", "columns", "n_slices"):
            if getattr(self, name) < 1:
                raise ValueError(f"PhantomSpec.{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "pixel_spacing_mm",
            "slice_spacing_mm",
            "slice_thickness_mm",
            "patient_scale",
            "anatomy_z_scale",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"PhantomSpec.{name} must be > 0, got {getattr(self, name)}")
        if self.noise_sigma_hu < 0 or self.blur_sigma_px < 0:
            raise ValueError("PhantomSpec noise_sigma_hu and blur_sigma_px must be >= 0")
        if not 0 <= self.contrast_enhancement <= 2:
            raise ValueError(
                f"PhantomSpec.contrast_enhancement must be in 0..2, got {self.contrast_enhancement}"
            )
        if not 0 <= self.n_lesions <= 100:
            raise ValueError(f"PhantomSpec.n_lesions must be in 0..100, got {self.n_lesions}")
        if self.lesion_max_diameter_mm is not None and not self.lesion_max_diameter_mm > 0:
            raise ValueError(
                "PhantomSpec.lesion_max_diameter_mm must be > 0 or None, "
                f"got {self.lesion_max_diameter_mm}"
            )

    # --- geometry -----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        """(slices, rows, columns) of the full volume."""
        return (self.n_slices, self.rows, self.columns)

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size (slice, row, column) in mm."""
        return (self.slice_spacing_mm, self.pixel_spacing_mm, self.pixel_spacing_mm)

    @property
    def origin(self) -> tuple[float, float, float]:
        """LPS position of the centre of voxel (0, 0, 0)."""
        half_x = (self.columns - 1) / 2.0 * self.pixel_spacing_mm
        half_y = (self.rows - 1) / 2.0 * self.pixel_spacing_mm
        return (-half_x, -half_y, self.first_slice_z_mm)

    def affine(self) -> np.ndarray:
        """4x4 affine of the full volume, (slice, row, column) -> LPS mm."""
        return Volume.from_geometry(
            np.zeros((1, 1, 1), np.uint8), spacing=self.spacing, origin=self.origin
        ).affine

    def with_slices(
        self, n_slices: int | None = None, slice_spacing_mm: float | None = None
    ) -> PhantomSpec:
        """Same patient with another z sampling, centred on the same coverage midpoint.

        The slice thickness follows the spacing when the spacing changes.
        """
        n = self.n_slices if n_slices is None else n_slices
        spacing = self.slice_spacing_mm if slice_spacing_mm is None else slice_spacing_mm
        thickness = self.slice_thickness_mm if slice_spacing_mm is None else spacing
        mid = self.first_slice_z_mm + (self.n_slices - 1) * self.slice_spacing_mm / 2.0
        return replace(
            self,
            n_slices=n,
            slice_spacing_mm=spacing,
            slice_thickness_mm=thickness,
            first_slice_z_mm=round(mid - (n - 1) * spacing / 2.0, 3),
        )

    # --- random draw --------------------------------------------------------------------
    @classmethod
    def random(cls, seed: int, *, small: bool = False) -> PhantomSpec:
        """Draw a plausible study from ``seed``; ``small`` gives a 128x128x40-60 phantom."""
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        rng = _rng(seed, 0)
        scale = float(rng.uniform(0.85, 1.15))
        offset_x = float(rng.uniform(-20.0, 20.0))
        offset_y = float(rng.uniform(-20.0, 20.0))
        if small:
            rows = columns = 128
            pixel = float(rng.uniform(2.5, 3.0))
            offset_x, offset_y = offset_x / 2.0, offset_y / 2.0
            # Scale the patient down where needed so the whole body fits the small FOV.
            fit = (columns * pixel - 30.0) / 2.0 - abs(offset_x)
            scale = min(scale, fit / _MAX_BODY_HALF_WIDTH)
            spacing = thickness = 5.0
            n_slices = int(rng.integers(40, 61))
            coverage = n_slices * spacing
            z_scale = min(1.0, (coverage - 10.0) / (scale * _anatomy_length()))
        else:
            rows = columns = 512
            need = (2.0 * (_MAX_BODY_HALF_WIDTH * scale + abs(offset_x)) + 30.0) / columns
            pixel = max(float(rng.uniform(0.6, 0.9)), need)
            spacing = float(rng.choice(_FULL_SLICE_SPACINGS))
            thickness = spacing if rng.random() < 0.7 else min(5.0, round(spacing * 1.6, 3))
            target = scale * float(rng.uniform(340.0, 400.0))
            n_slices = int(np.clip(round(target / spacing), _MIN_SLICES, _MAX_SLICES))
            coverage = n_slices * spacing
            z_scale = 1.0
        anatomy_z = round(float(rng.uniform(-250.0, 50.0)), 2)
        # Centre the coverage on the anatomy, with a jitter that keeps every organ in view.
        slack = max(0.0, coverage - scale * z_scale * _anatomy_length()) / 2.0
        jitter = float(rng.uniform(-1.0, 1.0)) * (slack + (0.0 if small else 10.0))
        mid = anatomy_z + scale * z_scale * sum(ANATOMY_Z_RANGE) / 2.0 + jitter
        first_z = round(mid - (n_slices - 1) * spacing / 2.0, 3)
        noise = float(rng.uniform(10.0, 25.0))
        blur = float(rng.uniform(0.5, 0.7))
        n_lesions = 0 if rng.random() < 0.15 else int(rng.integers(1, 7))
        return cls(
            seed=seed,
            small=small,
            rows=rows,
            columns=columns,
            n_slices=n_slices,
            pixel_spacing_mm=round(pixel, 4),
            slice_spacing_mm=spacing,
            slice_thickness_mm=thickness,
            first_slice_z_mm=first_z,
            patient_scale=round(scale, 4),
            patient_offset_mm=(round(offset_x, 2), round(offset_y, 2)),
            anatomy_z_mm=anatomy_z,
            anatomy_z_scale=round(z_scale, 4),
            noise_sigma_hu=round(noise, 2),
            blur_sigma_px=round(blur, 3),
            n_lesions=n_lesions,
        )

    # --- body frame ---------------------------------------------------------------------
    def body_axes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Body-frame coordinates (mm at patient scale 1) of every slice, row and column.

        The body frame has its origin at the body centre in-plane and at the diaphragm
        reference in z; anatomy is defined there and scaled/shifted into the patient.
        """
        ox, oy, oz = self.origin
        s = self.patient_scale
        px = ox + self.pixel_spacing_mm * np.arange(self.columns)
        py = oy + self.pixel_spacing_mm * np.arange(self.rows)
        pz = oz + self.slice_spacing_mm * np.arange(self.n_slices)
        qx = (px - self.patient_offset_mm[0]) / s
        qy = (py - self.patient_offset_mm[1]) / s
        qz = (pz - self.anatomy_z_mm) / (s * self.anatomy_z_scale)
        return qz.astype(np.float32), qy.astype(np.float32), qx.astype(np.float32)

    def body_to_patient(self, q: np.ndarray) -> np.ndarray:
        """(N, 3) body-frame (x, y, z) -> (N, 3) LPS mm."""
        q = np.atleast_2d(np.asarray(q, float))
        s = self.patient_scale
        out = np.empty_like(q)
        out[:, 0] = q[:, 0] * s + self.patient_offset_mm[0]
        out[:, 1] = q[:, 1] * s + self.patient_offset_mm[1]
        out[:, 2] = q[:, 2] * s * self.anatomy_z_scale + self.anatomy_z_mm
        return out

    def patient_to_body(self, p: np.ndarray) -> np.ndarray:
        """(N, 3) LPS mm -> (N, 3) body-frame (x, y, z)."""
        p = np.atleast_2d(np.asarray(p, float))
        s = self.patient_scale
        out = np.empty_like(p)
        out[:, 0] = (p[:, 0] - self.patient_offset_mm[0]) / s
        out[:, 1] = (p[:, 1] - self.patient_offset_mm[1]) / s
        out[:, 2] = (p[:, 2] - self.anatomy_z_mm) / (s * self.anatomy_z_scale)
        return out

    @property
    def blur_sigma_z_px(self) -> float:
        """Partial-volume blur along z: 0.4 x slice thickness, in slices."""
        return 0.4 * self.slice_thickness_mm / self.slice_spacing_mm


def _anatomy_length() -> float:
    return ANATOMY_Z_RANGE[1] - ANATOMY_Z_RANGE[0]


def blur_radius(sigma: float, truncate: float = 3.0) -> int:
    """Kernel half-width scipy.ndimage uses for ``sigma`` (so halos match it exactly)."""
    return int(truncate * sigma + 0.5) if sigma > 0 else 0


__all__ = ["ANATOMY_Z_RANGE", "ORGAN_LABELS", "ORGAN_NAMES", "PhantomSpec", "blur_radius"]
