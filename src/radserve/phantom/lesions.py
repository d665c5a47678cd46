"""Lesions with exact ground truth: drawn from the seed, checked to lie inside their organ.

Placement queries the painted anatomy at sample points (a point canvas), so a lesion
is accepted only if a shell slightly larger than the lesion lies entirely in its
organ, after every later-painted structure (ribs, spine, vessels' organs) is applied.
Centres are snapped to a voxel centre so every lesion owns at least that voxel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np

from radserve.phantom.anatomy import LESION_BASE, Anatomy, paint_anatomy
from radserve.phantom.shapes import Canvas, Ellipsoid, PointCanvas
from radserve.phantom.spec import ORGAN_LABELS, PhantomSpec, _rng

logger = logging.getLogger(__name__)

LesionKind = Literal["liver_hypodense", "liver_hyperdense", "lung_solid", "lung_part_solid"]
LesionOrgan = Literal["liver", "lung_left", "lung_right"]

# Diameter range (mm) per kind.
_DIAMETERS: dict[str, tuple[float, float]] = {
    "liver_hypodense": (5.0, 40.0),
    "liver_hyperdense": (5.0, 40.0),
    "lung_solid": (3.0, 30.0),
    "lung_part_solid": (6.0, 30.0),
}
_ORGAN_CHOICES: tuple[LesionOrgan, ...] = ("liver", "liver", "lung_left", "lung_right")
_MARGIN_MM = 2.0
_CANDIDATES = 48
_ATTEMPTS = 6


@dataclass(frozen=True)
class Lesion:
    """Ground truth of one lesion; positions and sizes in patient LPS millimetres.

    ``diameter_mm`` is the nominal diameter; the lesion is an axis-aligned ellipsoid
    with ``semi_axes_mm`` (x, y, z) within +-10 % of it. Part-solid nodules have a
    solid core of ``core_diameter_mm`` at ``hu`` inside ground glass at ``ggo_hu``;
    the lesion map covers the whole lesion.
    """

    lesion_id: int
    centre_mm: tuple[float, float, float]
    diameter_mm: float
    kind: LesionKind
    organ: LesionOrgan
    semi_axes_mm: tuple[float, float, float] = (0.0, 0.0, 0.0)
    hu: float = 0.0
    ggo_hu: float | None = None
    core_diameter_mm: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "lesion_id": self.lesion_id,
            "centre_mm": list(self.centre_mm),
            "diameter_mm": self.diameter_mm,
            "kind": self.kind,
            "organ": self.organ,
            "organ_label": ORGAN_LABELS[self.organ],
            "semi_axes_mm": list(self.semi_axes_mm),
            "hu": self.hu,
            "ggo_hu": self.ggo_hu,
            "core_diameter_mm": self.core_diameter_mm,
        }


@dataclass(frozen=True)
class PlacedLesion:
    """A lesion plus its body-frame shapes (whole lesion, and solid core if any)."""

    lesion: Lesion
    shape: Ellipsoid
    core: Ellipsoid | None


def _fibonacci_sphere(n: int) -> np.ndarray:
    i = np.arange(n) + 0.5
    phi = np.arccos(1 - 2 * i / n)
    theta = np.pi * (1 + 5**0.5) * i
    return np.stack([np.cos(theta) * np.sin(phi), np.sin(theta) * np.sin(phi), np.cos(phi)], 1)


_SHELL = np.concatenate([np.zeros((1, 3)), 0.6 * _fibonacci_sphere(32), _fibonacci_sphere(160)])
_SHELL_SCALE = np.concatenate([np.zeros(33), np.ones(160)])  # which rows get the margin


def _snap(spec: PhantomSpec, centres: np.ndarray) -> np.ndarray:
    """Move LPS points to the nearest voxel centre of the full grid."""
    origin, spacing = np.asarray(spec.origin), np.asarray(spec.spacing)[[2, 1, 0]]
    idx = np.rint((centres - origin) / spacing)
    upper = np.array([spec.columns - 1, spec.rows - 1, spec.n_slices - 1])
    return origin + np.clip(idx, 0, upper) * spacing


def place_lesions(spec: PhantomSpec, anatomy: Anatomy) -> list[PlacedLesion]:
    """Draw ``spec.n_lesions`` lesions; any that cannot be placed are dropped (logged)."""
    rng = _rng(spec.seed, 2)
    origin = np.asarray(spec.origin)
    far = origin + (np.array(spec.shape[::-1]) - 1) * np.asarray(spec.spacing)[::-1]
    placed: list[PlacedLesion] = []
    for _ in range(spec.n_lesions):
        organ = _ORGAN_CHOICES[int(rng.integers(0, len(_ORGAN_CHOICES)))]
        if organ == "liver":
            kind: LesionKind = "liver_hypodense" if rng.random() < 0.6 else "liver_hyperdense"
        else:
            kind = "lung_solid" if rng.random() < 0.7 else "lung_part_solid"
        lo_d, hi_d = _DIAMETERS[kind]
        lo_d = max(lo_d, 2.0 * spec.pixel_spacing_mm)
        if spec.lesion_max_diameter_mm is not None:
            hi_d = max(lo_d, min(hi_d, spec.lesion_max_diameter_mm))
        diameter = float(np.exp(rng.uniform(np.log(lo_d), np.log(hi_d))))
        semi = diameter / 2 * rng.uniform(0.9, 1.1, 3)
        lesion = _place_one(spec, anatomy, rng, organ, semi, placed, origin, far)
        if lesion is None:
            logger.debug("seed %d: no room for a %.1f mm %s lesion", spec.seed, diameter, kind)
            continue
        centre = lesion
        hu = float(rng.uniform(160, 180) if kind == "liver_hyperdense" else rng.uniform(20, 40))
        ggo_hu = core_d = None
        core = None
        body_semi = _body_semi(spec, semi)
        body_centre = spec.patient_to_body(centre)[0]
        if kind == "lung_part_solid":
            ggo_hu = float(rng.uniform(-600, -450))
            frac = float(rng.uniform(0.35, 0.6))
            core_d = round(diameter * frac, 2)
            core = Ellipsoid(tuple(body_centre), tuple(body_semi * frac))
        k = len(placed) + 1
        placed.append(
            PlacedLesion(
                Lesion(
                    lesion_id=k,
                    centre_mm=tuple(round(float(c), 4) for c in centre),
                    diameter_mm=round(diameter, 2),
                    kind=kind,
                    organ=organ,
                    semi_axes_mm=tuple(round(float(s), 3) for s in semi),
                    hu=round(hu, 1),
                    ggo_hu=None if ggo_hu is None else round(ggo_hu, 1),
                    core_diameter_mm=core_d,
                ),
                Ellipsoid(tuple(body_centre), tuple(body_semi)),
                core,
            )
        )
    return placed


def _body_semi(spec: PhantomSpec, semi_mm: np.ndarray) -> np.ndarray:
    s = spec.patient_scale
    return np.asarray(semi_mm) / np.array([s, s, s * spec.anatomy_z_scale])


def _place_one(
    spec: PhantomSpec,
    anatomy: Anatomy,
    rng: np.random.Generator,
    organ: str,
    semi: np.ndarray,
    placed: list[PlacedLesion],
    origin: np.ndarray,
    far: np.ndarray,
) -> np.ndarray | None:
    """Centre (LPS) of a lesion of ``semi`` fully inside ``organ``, or None."""
    lo, hi = anatomy.organ_blob(organ).bbox()
    box = spec.body_to_patient(np.stack([lo, hi]))
    lo_p = np.maximum(box.min(0), origin + semi + _MARGIN_MM)
    hi_p = np.minimum(box.max(0), far - semi - _MARGIN_MM)
    if np.any(hi_p <= lo_p):
        return None
    label = ORGAN_LABELS[organ]
    shell_mm = _SHELL * (semi + _MARGIN_MM * _SHELL_SCALE[:, None])
    for _ in range(_ATTEMPTS):
        centres = _snap(spec, rng.uniform(lo_p, hi_p, (_CANDIDATES, 3)))
        ok = np.ones(len(centres), bool)
        for other in placed:
            gap = np.linalg.norm(centres - np.asarray(other.lesion.centre_mm), axis=1)
            ok &= gap > max(other.lesion.semi_axes_mm) + semi.max() + _MARGIN_MM
        if not ok.any():
            continue
        centres = centres[ok]
        points = (centres[:, None, :] + shell_mm[None, :, :]).reshape(-1, 3)
        canvas = PointCanvas(spec.patient_to_body(points))
        paint_anatomy(canvas, anatomy, vessels=False)
        inside = (canvas.organ.reshape(len(centres), -1) == label).all(axis=1)
        if inside.any():
            return centres[int(np.argmax(inside))]
    return None


# A hyperdense liver lesion is hyperdense by its enhancement: unenhanced it is near the
# liver's own 55 HU (drawn at 160-180 HU enhanced, 170 on average; a hypodense one is
# dark either way).
_HYPERDENSE_NATIVE_HU = 60.0
_HYPERDENSE_NOMINAL_HU = 170.0


def lesion_hu(
    placed: list[PlacedLesion], table: np.ndarray, contrast_enhancement: float = 1.0
) -> np.ndarray:
    """Copy of the HU table with each lesion's tissue codes filled in (an enhancing
    lesion's rise scaled like the organs', :func:`radserve.phantom.anatomy.hu_table`)."""
    table = table.copy()
    for p in placed:
        code = LESION_BASE + 2 * (p.lesion.lesion_id - 1)
        table[code] = p.lesion.hu
        if p.lesion.kind == "liver_hyperdense":
            table[code] -= (1.0 - contrast_enhancement) * (
                _HYPERDENSE_NOMINAL_HU - _HYPERDENSE_NATIVE_HU
            )
        if p.lesion.ggo_hu is not None:
            table[code + 1] = p.lesion.ggo_hu
    return table


def paint_lesions(canvas: Canvas, placed: list[PlacedLesion]) -> None:
    """Lesion tissue and ids; the organ map is untouched (lesions belong to their organ)."""
    for p in placed:
        k = p.lesion.lesion_id
        code = LESION_BASE + 2 * (k - 1)
        lo, hi = p.shape.bbox()
        region = canvas.region(lo, hi)
        if region is None:
            continue
        mask = p.shape.contains(region.x, region.y, region.z)
        whole = code + 1 if p.core is not None else code
        canvas.paint(region, mask, tissue=whole, lesion=k)
        if p.core is not None:
            mask = p.core.contains(region.x, region.y, region.z)
            canvas.paint(region, mask, tissue=code)
