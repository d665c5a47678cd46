"""The phantom's anatomy: nominal organ shapes perturbed per seed, and their painting.

Everything here lives in the *body frame*: millimetres at patient scale 1, origin at
the body centre in-plane and at the diaphragm reference in z, +x patient left,
+y posterior, +z superior (LPS axes). ``PhantomSpec.body_axes`` maps the voxel grid
into this frame. Painting order resolves overlaps: later structures win.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from itertools import pairwise

import numpy as np

from radserve.phantom.shapes import (
    Array,
    Blob,
    BodyContour,
    Canvas,
    Capsule,
    PixelFilter,
    Region,
    Shape,
)
from radserve.phantom.skeleton import Box2D, Diaphragm, Ribs, Spine
from radserve.phantom.spec import ORGAN_LABELS, PhantomSpec, _rng


class Tissue(IntEnum):
    """Internal tissue classes; each maps to one HU value per phantom."""

    AIR = 0
    FAT = 1
    MUSCLE = 2
    SOFT = 3
    LUNG = 4
    VESSEL = 5
    LIVER = 6
    SPLEEN = 7
    KIDNEY = 8
    MYOCARDIUM = 9
    BLOOD = 10
    AORTA = 11
    CANCELLOUS = 12
    CORTEX = 13
    POSTERIOR = 14
    DISC = 15
    CANAL = 16
    RIB = 17
    TABLE_SHELL = 18
    TABLE_CORE = 19


# Lesion k (1-based) uses tissue LESION_BASE + 2(k-1) (solid part) and +1 (ground glass).
LESION_BASE = 32
NON_BODY_TISSUES = (Tissue.AIR, Tissue.TABLE_SHELL, Tissue.TABLE_CORE)

# Portal-venous phase HU: (nominal, +- per-seed jitter).
_HU: dict[Tissue, tuple[float, float]] = {
    Tissue.AIR: (-1000.0, 0.0),
    Tissue.FAT: (-100.0, 10.0),
    Tissue.MUSCLE: (50.0, 5.0),
    Tissue.SOFT: (40.0, 5.0),
    Tissue.LUNG: (-850.0, 20.0),
    Tissue.VESSEL: (100.0, 40.0),
    Tissue.LIVER: (100.0, 8.0),
    Tissue.SPLEEN: (110.0, 8.0),
    Tissue.KIDNEY: (160.0, 15.0),
    Tissue.MYOCARDIUM: (80.0, 8.0),
    Tissue.BLOOD: (130.0, 15.0),
    Tissue.AORTA: (250.0, 30.0),
    Tissue.CANCELLOUS: (300.0, 20.0),
    Tissue.CORTEX: (700.0, 30.0),
    Tissue.POSTERIOR: (550.0, 30.0),
    Tissue.DISC: (80.0, 5.0),
    Tissue.CANAL: (20.0, 5.0),
    Tissue.RIB: (500.0, 30.0),
    Tissue.TABLE_SHELL: (200.0, 0.0),
    Tissue.TABLE_CORE: (-650.0, 0.0),
}

_L = ORGAN_LABELS
Condition = Callable[[Region], Array]


@dataclass(frozen=True)
class Anatomy:
    """All shapes of one patient, in the body frame."""

    body: BodyContour
    fat_mm: float
    muscle_mm: float
    visceral_inset_mm: float  # depth below the skin of the inner surface of the ribs
    diaphragm: Diaphragm
    lung_left: Blob
    lung_right: Blob
    vessels_left: tuple[Capsule, ...]
    vessels_right: tuple[Capsule, ...]
    heart: Blob
    heart_wall_mm: float
    liver: Blob
    spleen: Blob
    kidney_left: Blob
    kidney_right: Blob
    aorta: tuple[Capsule, ...]
    muscles: tuple[Blob, ...]
    spine: Spine
    ribs: Ribs
    table: tuple[Box2D, Box2D] | None
    hu: np.ndarray  # float32[256], indexed by tissue code

    def organ_blob(self, organ: str) -> Blob:
        return getattr(self, organ)


def _vessel_tree(
    rng: np.random.Generator, root: np.ndarray, direction: np.ndarray, *, depth: int = 4
) -> list[Capsule]:
    """A random binary tree of tapering tubes: a pulmonary vessel branch."""
    segments: list[Capsule] = []
    stack = [(root, direction / np.linalg.norm(direction), 4.5, 42.0, 0)]
    while stack:
        start, d, radius, length, gen = stack.pop()
        end = start + d * length * rng.uniform(0.8, 1.2)
        segments.append(Capsule(tuple(start), tuple(end), radius, radius * 0.85))
        if gen + 1 < depth:
            for _ in range(2):
                nd = d + rng.normal(0.0, 0.5, 3)
                stack.append((end, nd / np.linalg.norm(nd), radius * 0.72, length * 0.78, gen + 1))
    return segments


# Unenhanced HU of the tissues contrast medium brightens: a non-contrast CT
# (``contrast_enhancement`` 0) has these instead of the portal-venous values above.
NATIVE_HU: dict[Tissue, float] = {
    Tissue.VESSEL: 40.0,
    Tissue.LIVER: 55.0,
    Tissue.SPLEEN: 45.0,
    Tissue.KIDNEY: 30.0,
    Tissue.MYOCARDIUM: 45.0,
    Tissue.BLOOD: 40.0,
    Tissue.AORTA: 40.0,
}


def hu_table(seed: int, contrast_enhancement: float = 1.0) -> np.ndarray:
    """HU of each tissue code for this seed (lesion entries are filled by the lesions).

    ``contrast_enhancement`` scales each enhancing tissue's rise above its unenhanced HU
    (1: portal-venous as drawn, 0: no contrast); the seed's draws are the same at any
    value, so only the enhancement differs between two such phantoms."""
    rng = _rng(seed, 3)
    table = np.full(256, -1000.0, np.float32)
    for tissue, (nominal, jitter) in _HU.items():
        value = nominal + (rng.uniform(-jitter, jitter) if jitter else 0.0)
        if tissue in NATIVE_HU:
            value -= (1.0 - contrast_enhancement) * (nominal - NATIVE_HU[tissue])
        table[tissue] = value
    return table


def build_anatomy(spec: PhantomSpec) -> Anatomy:
    """Draw one patient's organs from ``spec.seed`` (independent of the acquisition)."""
    rng = _rng(spec.seed, 1)
    u = rng.uniform
    body = BodyContour(
        half_width=150.0 * u(0.94, 1.06),
        half_ap_anterior=105.0 * u(0.9, 1.08),
        half_ap_posterior=95.0 * u(0.92, 1.08),
        p=u(2.2, 2.8),
        mod_amps=(u(-0.03, 0.03), u(-0.02, 0.02)),
        mod_phases=(u(0, 2 * np.pi), u(0, 2 * np.pi)),
    )
    fat, muscle = u(8.0, 35.0), u(8.0, 14.0)
    rib_outer = fat + 0.5 * muscle
    rib_thickness = u(8.0, 10.0)
    visceral = rib_outer + rib_thickness + 1.0
    diaphragm = Diaphragm(
        right=(-60.0 + u(-8, 8), u(-10, 10), 8.0 + u(-8, 8)),
        left=(60.0 + u(-8, 8), u(-10, 10), -5.0 + u(-8, 8)),
    )

    def blob(
        centre: tuple[float, float, float], semi: tuple[float, float, float], **kw: float
    ) -> Blob:
        return Blob.random(rng, centre, semi, **kw)

    lung_kw = {"p": 2.5, "deform": 0.08}
    lung_left = blob((85.0, 5.0, 80.0), (72.0, 100.0, 120.0), **lung_kw)
    lung_right = blob((-85.0, 5.0, 82.0), (74.0, 100.0, 120.0), **lung_kw)
    vessels: dict[int, list[Capsule]] = {}
    for side in (1, -1):
        hilum = np.array([side * 42.0, 5.0, 55.0]) + rng.uniform(-5, 5, 3)
        directions = (
            [0.35, -0.1, 1.0], [0.4, 0.6, 0.9], [0.6, -0.8, 0.6], [1.0, -0.6, 0.1],
            [1.0, 0.5, -0.2], [0.5, 0.2, -1.0], [0.5, 1.0, -0.5], [0.8, -0.5, -0.8],
        )  # fmt: skip
        vessels[side] = []
        for d in directions:
            dv = np.array([side * d[0], d[1], d[2]]) + rng.normal(0, 0.15, 3)
            vessels[side] += _vessel_tree(rng, hilum, dv, depth=6)
    heart = blob((18.0, -32.0, 48.0), (58.0, 42.0, 46.0), theta=-0.7, deform=0.06)
    liver = blob(
        (-62.0, -2.0, -72.0), (88.0, 82.0, 88.0), p=2.6, q=2.2, theta=0.15,
        taper=0.45, z_taper=0.8, deform=0.1,
    )  # fmt: skip
    spleen = blob((80.0, 42.0, -48.0), (55.0, 24.0, 48.0), theta=2.06, deform=0.1)
    kidney_left = blob((64.0, 48.0, -118.0), (27.0, 20.0, 55.0), theta=0.5, shift_mm=6.0)
    kidney_right = blob((-64.0, 50.0, -132.0), (27.0, 20.0, 55.0), theta=-0.5, shift_mm=6.0)
    ra = u(0.9, 1.1)
    path = [
        ((14.0, -3.0, -400.0), 11.0), ((14.0, -3.0, -100.0), 11.0), ((22.0, 4.0, 0.0), 12.0),
        ((28.0, 8.0, 100.0), 12.0), ((22.0, -5.0, 138.0), 13.0), ((5.0, -28.0, 140.0), 14.0),
        ((-2.0, -38.0, 110.0), 15.0), ((0.0, -34.0, 60.0), 15.0),
    ]  # fmt: skip
    aorta = tuple(Capsule(a, b, ra * r0, ra * r1) for (a, r0), (b, r1) in pairwise(path))
    muscles = tuple(
        blob((side * 33.0, 70.0, 0.0), (19.0, 15.0, 1e4), deform=0.04, shift_mm=3.0)
        for side in (1, -1)
    ) + tuple(
        blob((side * 38.0, 30.0, -270.0), (15.0, 15.0, 200.0), q=4.0, deform=0.04, shift_mm=3.0)
        for side in (1, -1)
    )
    spine = Spine(x0=u(-2, 2), y_canal=52.0 + u(-3, 3), period=u(25, 29), disc=u(5, 7),
                  phase=u(0, 27))  # fmt: skip
    ribs = Ribs(
        body=body, outer_inset=rib_outer, thickness=rib_thickness,
        z_top=185.0 + u(-8, 8), period=u(22, 25),
    )  # fmt: skip
    table = None
    if spec.with_table:
        s = spec.patient_scale
        top = body.half_ap_posterior * body.sigma_max + 3.0 / s
        shell, core, half = 3.0 / s, 30.0 / s, 225.0 / s
        x0 = -spec.patient_offset_mm[0] / s
        table = (
            Box2D(x0 - half, x0 + half, top, top + 2 * shell + core),
            Box2D(x0 - half + shell, x0 + half - shell, top + shell, top + shell + core),
        )
    return Anatomy(
        body=body,
        fat_mm=fat,
        muscle_mm=muscle,
        visceral_inset_mm=visceral,
        diaphragm=diaphragm,
        lung_left=lung_left,
        lung_right=lung_right,
        vessels_left=tuple(vessels[1]),
        vessels_right=tuple(vessels[-1]),
        heart=heart,
        heart_wall_mm=u(8.0, 12.0),
        liver=liver,
        spleen=spleen,
        kidney_left=kidney_left,
        kidney_right=kidney_right,
        aorta=aorta,
        muscles=muscles,
        spine=spine,
        ribs=ribs,
        table=table,
        hu=hu_table(spec.seed, spec.contrast_enhancement),
    )


def _paint(
    canvas: Canvas,
    shape: Shape,
    cond: Condition | None = None,
    pixel_filter: PixelFilter | None = None,
    **values: int,
) -> None:
    """Paint ``shape`` (optionally only where ``cond(region)``) with ``values``."""
    lo, hi = shape.bbox()
    region = canvas.region(lo, hi, pixel_filter)
    if region is None:
        return
    mask = shape.contains(region.x, region.y, region.z)
    if cond is not None:
        mask = mask & cond(region)
    canvas.paint(region, mask, **values)


def paint_anatomy(canvas: Canvas, anatomy: Anatomy, *, vessels: bool = True) -> None:
    """Paint every structure in order (later wins); lesions are painted separately.

    ``vessels=False`` skips the lung vessels, which change tissue but never the organ
    map: organ queries (lesion placement) are then much cheaper and give the same answer.
    """
    a = anatomy
    body = a.body

    def inside(inset: float) -> Condition:
        return lambda r: body.inside(r.x, r.y, r.z, inset)

    def above_dome(r: Region) -> Array:
        return r.z > a.diaphragm.height(r.x, r.y) + np.float32(2.0)

    def below_dome(r: Region) -> Array:
        return r.z < a.diaphragm.height(r.x, r.y) - np.float32(2.0)

    def in_lung(r: Region) -> Array:
        organ = canvas.get(canvas.organ, r)
        return (organ == _L["lung_left"]) | (organ == _L["lung_right"])

    def visceral_and(extra: Condition) -> Condition:
        cavity = inside(a.visceral_inset_mm)
        return lambda r: cavity(r) & extra(r)

    if a.table is not None:
        _paint(canvas, a.table[0], tissue=Tissue.TABLE_SHELL)
        _paint(canvas, a.table[1], tissue=Tissue.TABLE_CORE)
    _paint(canvas, _InsetBody(body, 0.0), tissue=Tissue.FAT)
    muscle_wall = _InsetBody(body, a.fat_mm)
    _paint(canvas, muscle_wall, tissue=Tissue.MUSCLE)
    _paint(canvas, _InsetBody(body, a.fat_mm + a.muscle_mm), tissue=Tissue.SOFT)
    for m in a.muscles:
        _paint(canvas, m, cond=inside(a.fat_mm), tissue=Tissue.MUSCLE)
    lung_cond = visceral_and(above_dome)
    _paint(canvas, a.lung_left, cond=lung_cond, tissue=Tissue.LUNG, organ=_L["lung_left"])
    _paint(canvas, a.lung_right, cond=lung_cond, tissue=Tissue.LUNG, organ=_L["lung_right"])
    zlo, zhi = canvas.z_range()
    for v in (a.vessels_left + a.vessels_right) if vessels else ():
        lo, hi = v.bbox()
        if hi[2] >= zlo and lo[2] <= zhi:
            _paint(canvas, v, cond=in_lung, tissue=Tissue.VESSEL)
    _paint(canvas, a.heart, cond=lung_cond, tissue=Tissue.MYOCARDIUM, organ=_L["heart"])
    _paint(canvas, a.heart.shrunk(a.heart_wall_mm), cond=lung_cond, tissue=Tissue.BLOOD)
    abdomen = visceral_and(below_dome)
    _paint(canvas, a.liver, cond=abdomen, tissue=Tissue.LIVER, organ=_L["liver"])
    _paint(canvas, a.spleen, cond=abdomen, tissue=Tissue.SPLEEN, organ=_L["spleen"])
    cavity = inside(a.visceral_inset_mm)
    _paint(canvas, a.kidney_left, cond=cavity, tissue=Tissue.KIDNEY, organ=_L["kidney_left"])
    _paint(canvas, a.kidney_right, cond=cavity, tissue=Tissue.KIDNEY, organ=_L["kidney_right"])
    for seg in a.aorta:
        _paint(canvas, seg, tissue=Tissue.AORTA, organ=_L["aorta"])
    _paint_spine(canvas, a.spine)
    _paint(canvas, a.ribs, pixel_filter=a.ribs.pixel_filter(), tissue=Tissue.RIB, organ=_L["ribs"])


@dataclass(frozen=True)
class _InsetBody:
    """The body contour shrunk by a layer thickness (fat -> muscle -> cavity)."""

    body: BodyContour
    inset_mm: float

    def bbox(self) -> tuple[Array, Array]:
        return self.body.bbox()

    def contains(self, x: Array, y: Array, z: Array) -> Array:
        return self.body.inside(x, y, z, self.inset_mm)


def _paint_spine(canvas: Canvas, spine: Spine) -> None:
    lo, hi = spine.bbox()
    region = canvas.region(lo, hi)
    if region is None:
        return
    parts = spine.parts(region.x, region.y, region.z)
    canvas.paint(region, parts["disc"], tissue=Tissue.DISC, organ=0)
    canvas.paint(region, parts["cortex"], tissue=Tissue.CORTEX, organ=_L["spine"])
    canvas.paint(region, parts["cancellous"], tissue=Tissue.CANCELLOUS)
    canvas.paint(region, parts["posterior"], tissue=Tissue.POSTERIOR, organ=_L["spine"])
    canvas.paint(region, parts["canal"], tissue=Tissue.CANAL, organ=0)
