"""The input domain a model declares (``input_domain:`` in model.yaml): the acquisitions it
was trained and validated on. A study outside it is flagged in its report (warning code
``outside_input_domain``) or refused, by the ingest policy's ``input_domain`` choice.

Pure data and a pure check, so the manifest (radserve.models) can hold it and the run
path (radserve.pipeline) can apply it without either importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

OUTSIDE_INPUT_DOMAIN = "outside_input_domain"
INPUT_DOMAIN_UNCHECKED = "input_domain_unchecked"
# Where the pixel measurements look (radserve.pipeline.ct_number / ct_noise), here so that
# the report's "not checked" notes name the windows the measurements use.
# A body's fat peak, calibrated or off by up to ~100 HU: above lung and its partial
# volumes, below water and soft tissue.
FAT_SEARCH_HU = (-250, -10)
# Soft tissue, blood and contrast-enhanced organs; not fat, lung, air or bone.
SOFT_TISSUE_HU = (-150.0, 250.0)
# A body on CT: tissue above air and lung (the threshold the body box and the drift
# features use too). Pixel Padding Value is read as air (-1000 HU), so padding is no body.
BODY_HU = -500.0
# A CT whose voxels above BODY_HU fill less than this share of the volume holds no body:
# an empty field (all air), all padding, or a small object in a large field. The smallest
# patient radserve's models read fills several times as much (a neonate's chest in a
# 50 cm field: ~3 %; an adult chest, lungs left out: ~10 %).
MIN_BODY_SHARE = 0.01
# A CT whose tissue (above BODY_HU) is only thin or flat holds no body either, however
# much of the field it fills: a table, a cushion, a head holder, phantom rods
# (radserve.pipeline.ct_body measures it). The smallest body part a site scans (a wrist,
# a neonate's limb) holds a disc this wide in its cross-section ...
MIN_BODY_THICKNESS_MM = 30.0
# ... a band of image rows holding tissue across the field no thicker than this is a
# table (with its pad), left out before the cross-sections are judged ...
MAX_SLAB_MM = 100.0
# ... and a cross-section whose area exceeds this many times its thickness squared is a
# slab (the phantoms' table: ~12; an adult chest: ~1-2; a limb lying on a table: ~3).
MAX_ELONGATION = 8.0
# The fields that name region labels (a model's own, or an earlier step's)
STRUCTURE_FIELDS = ("structure_volumes_ml", "structure_hu")


class Interval(BaseModel):
    """A closed interval of any sign; either end may be open (None)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Interval:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"range min {self.min} is above max {self.max}")
        return self

    def contains(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def __str__(self) -> str:
        lo = "-inf" if self.min is None else f"{self.min:g}"
        hi = "inf" if self.max is None else f"{self.max:g}"
        return f"[{lo}, {hi}]"


class Range(Interval):
    """An interval of sizes, counts or volumes: neither end below 0."""

    min: float | None = Field(None, ge=0)
    max: float | None = Field(None, ge=0)


class InputDomain(BaseModel):
    """What the model was trained on. Every field is optional: an absent one is not
    checked. ``body_parts`` are Body Part Examined values (any of them); a study without
    Body Part Examined is not judged on it (the report notes that it could not be, as it
    does for a CT whose fat could not be found)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pixel_spacing_mm: Range | None = None  # in-plane, the larger of row/column spacing
    slice_thickness_mm: Range | None = None  # Slice Thickness, else the slice step
    fov_mm: Range | None = None  # in-plane field of view: the larger of rows/columns x spacing
    matrix: Range | None = None  # rows and columns, each
    # z extent in mm (slices x slice step): what the model needs of the body. Declare this
    # rather than ``slices``: a slice count fixes coverage only together with the
    # thickness, so ``slices`` beside a thickness range contradicts itself (100-500
    # slices with slices up to 5 mm refuses a 375 mm chest-abdomen at 5 mm, 75 slices).
    coverage_mm: Range | None = None
    # Kept so bundles written before ``coverage_mm`` still load and are checked as they
    # declare; new declarations should use ``coverage_mm``.
    slices: Range | None = None
    body_parts: tuple[str, ...] = ()
    # What the model's own output looks like on studies it was validated on: the volume
    # (ml) of each region label when the structure lies wholly in view. A study can match
    # every geometric range and still look unlike the training data (another scanner's
    # appearance, a phantom drawn by someone else); a whole structure far outside its
    # volume range is how that shows, so it is flagged like a geometry outside the ranges.
    # A model without region labels (a lesion model) names the structures of the earlier
    # pipeline steps instead, measured on their label maps (here and in structure_hu).
    structure_volumes_ml: dict[str, Range] = {}
    # CT only: the mean HU of a region label the model segments, where the training data
    # puts it: contrast medium shows here (the aorta of a non-contrast CT reads ~40 HU, of
    # a portal-venous one ~150-250), and a model trained on one phase sees another as
    # other tissue. Judged on any structure found, whole or partial.
    structure_hu: dict[str, Interval] = {}
    # CT only: where the body's fat reads (HU, the peak of its histogram; measured from the
    # pixels by radserve.pipeline.ct_number). It checks the scanner's CT-number
    # calibration, which no header states: a study shifted by tens of HU has every
    # geometry inside the ranges and still looks like another contrast to the model.
    fat_hu: Interval | None = None
    # CT only: the study's pixel noise (HU, one standard deviation of a soft-tissue pixel;
    # measured by radserve.pipeline.ct_noise). A noisier study than the model learned
    # (a low-dose protocol, a large patient) has its headers inside every range and can
    # still read noise as findings.
    noise_hu: Range | None = None

    def named_structures(self) -> list[tuple[str, str]]:
        """(field, label name) for every structure the declaration names."""
        return [(field, name) for field in STRUCTURE_FIELDS for name in getattr(self, field)]

    @model_validator(mode="after")
    def _whole_counts(self) -> InputDomain:
        """Slice and matrix counts are whole numbers; a coverage or spacing of 0 mm is no
        acquisition (a typo such as ``coverage_mm: {max: 0}`` would flag every study)."""
        for name in ("matrix", "slices"):
            bound: Range | None = getattr(self, name)
            for end in (bound.min, bound.max) if bound is not None else ():
                if end is not None and end != int(end):
                    raise ValueError(f"input_domain.{name}: {end:g} is not a whole count")
        for name in ("pixel_spacing_mm", "slice_thickness_mm", "fov_mm", "coverage_mm"):
            bound = getattr(self, name)
            if bound is not None and bound.max == 0:
                raise ValueError(f"input_domain.{name}: max 0 mm admits no study")
        return self


@dataclass(frozen=True)
class AcquisitionFacts:
    """What a study's series says about its acquisition, as the domain check needs it."""

    modality: str
    pixel_spacing_mm: float
    slice_thickness_mm: float
    rows: int
    columns: int
    slices: int
    body_part: str  # "" when absent
    slice_spacing_mm: float | None = None  # the step between slices; None: the thickness
    # The body's fat peak in HU, measured from the pixels (CT only); None: no fat peak was
    # found, or it was not measured (another modality).
    fat_hu: float | None = None
    # The pixel noise in HU (CT only, radserve.pipeline.ct_noise); None: not measured.
    noise_hu: float | None = None
    # The share of the volume's voxels above BODY_HU (CT only); None: not measured.
    body_share: float | None = None
    # The diameter (mm) of the thickest axial cross-section of tissue that is not a slab
    # (CT only, radserve.pipeline.ct_body); None: not measured.
    body_thickness_mm: float | None = None

    @property
    def fov_mm(self) -> float:
        return max(self.rows, self.columns) * self.pixel_spacing_mm

    @property
    def coverage_mm(self) -> float:
        """The z extent: slices x slice step (the thickness when the step is unknown)."""
        step = self.slice_spacing_mm if self.slice_spacing_mm else self.slice_thickness_mm
        return self.slices * step


def domain_violations(
    domain: InputDomain | None, modality: str, facts: AcquisitionFacts
) -> list[str]:
    """Each way ``facts`` lie outside the model's declared domain (empty: inside)."""
    readings = readings_outside(domain, facts)
    return header_violations(domain, modality, facts) + [r.describe() for r in readings]


def header_violations(
    domain: InputDomain | None, modality: str, facts: AcquisitionFacts
) -> list[str]:
    """:func:`domain_violations` of what the headers state (not the pixel readings)."""
    out: list[str] = []
    if facts.modality and modality and facts.modality.upper() != modality.upper():
        out.append(f"modality {facts.modality} (model: {modality})")
    if domain is None:
        return out
    checks: list[tuple[str, Range | None, float, str]] = [
        ("pixel spacing", domain.pixel_spacing_mm, facts.pixel_spacing_mm, " mm"),
        ("slice thickness", domain.slice_thickness_mm, facts.slice_thickness_mm, " mm"),
        ("field of view", domain.fov_mm, facts.fov_mm, " mm"),
        ("coverage", domain.coverage_mm, facts.coverage_mm, " mm"),
        ("slices", domain.slices, float(facts.slices), ""),
    ]
    for name, allowed, value, unit in checks:
        if allowed is not None and not allowed.contains(value):
            out.append(f"{name} {value:.4g}{unit} outside {allowed}{unit}")
    if domain.matrix is not None:
        for name, value in (("rows", facts.rows), ("columns", facts.columns)):
            if not domain.matrix.contains(value):
                out.append(f"{name} {value} outside {domain.matrix}")
    if domain.body_parts and facts.body_part:
        wanted = {p.upper() for p in domain.body_parts}
        if facts.body_part.upper() not in wanted:
            out.append(f"body part {facts.body_part} (model: {', '.join(domain.body_parts)})")
    return out


@dataclass(frozen=True)
class PixelReading:
    """A measurement of the pixels (the fat peak, the noise) outside its declared range:
    kept whole so that an evaluation can pool one model's readings over many studies."""

    what: str  # fat | noise
    hu: float
    allowed: Interval
    meaning: str

    def describe(self, hu: str | None = None, where: str = "") -> str:
        """The violation's words; ``hu`` replaces the one value (a span of them), ``where``
        follows it (in how many studies)."""
        shown = f"{self.hu:.0f}" if hu is None else hu
        return f"{self.what} reads {shown} HU{where}, outside {self.allowed} HU: {self.meaning}"


def readings_outside(domain: InputDomain | None, facts: AcquisitionFacts) -> list[PixelReading]:
    """The study's pixel measurements that lie outside the declared ranges."""
    if domain is None:
        return []
    checks: list[tuple[str, float | None, Interval | None, str]] = [
        ("fat", facts.fat_hu, domain.fat_hu, "the CT numbers may be miscalibrated"),
        (
            "noise",
            facts.noise_hu,
            domain.noise_hu,
            "a noisier (or smoother) acquisition than the model was validated on",
        ),
    ]
    return [
        PixelReading(what, value, allowed, meaning)
        for what, value, allowed, meaning in checks
        if allowed is not None and value is not None and not allowed.contains(value)
    ]


def body_missing(facts: AcquisitionFacts) -> str | None:
    """Why a CT holds no body in view, or None (another modality, not measured, or a
    body in view).

    No body: voxels above :data:`BODY_HU` fill less than :data:`MIN_BODY_SHARE` of the
    volume (air, padding, a small object in a large field), or all of them are thin or
    flat (no cross-section :data:`MIN_BODY_THICKNESS_MM` thick that is not a slab: a
    table, a cushion, a head holder, phantom rods; a field smaller than that is judged
    against its own width).

    Whatever a model declares: every model is trained on patients, and on a volume
    without one its "no findings" reads as a normal study. Flagged ``outside_input_domain``
    and never refused, whatever ``ingest.input_domain`` says: the sender still gets a
    report, one that says why its negative result says nothing."""
    if facts.modality.upper() != "CT":
        return None
    share, thickness = facts.body_share, facts.body_thickness_mm
    tail = (
        "outside the input domain of every model; a result without findings says nothing "
        "about a patient"
    )
    if share is not None and share < MIN_BODY_SHARE:
        found = f"{share * 100:.2g} % of the voxels read" if share > 0 else "no voxel reads"
        return (
            f"no body in view: {found} above {BODY_HU:g} HU (tissue), less than the "
            f"{MIN_BODY_SHARE * 100:g} % any patient fills (an empty or padded volume, or a "
            f"small object in a large field): {tail}"
        )
    needed = min(MIN_BODY_THICKNESS_MM, facts.fov_mm) if facts.fov_mm > 0 else 0.0
    if thickness is None or thickness >= needed:
        return None
    found = f"{thickness:.0f} mm" if thickness > 0 else "none"
    return (
        f"no body in view: the tissue above {BODY_HU:g} HU is only thin or flat objects "
        "(a table, a cushion, a head holder, phantom rods): its thickest cross-section that "
        f"is not a slab measures {found}, less than the {MIN_BODY_THICKNESS_MM:g} mm of the "
        f"smallest body part: {tail}"
    )


def domain_unchecked(domain: InputDomain | None, facts: AcquisitionFacts) -> list[str]:
    """Each declared part of ``domain`` the study gives no value to judge by: neither
    inside nor outside, so the report says it was not checked."""
    if domain is None:
        return []
    out = []
    if domain.body_parts and not facts.body_part:
        out.append("body part not checked: the series has no Body Part Examined")
    if domain.fat_hu is not None and facts.modality.upper() == "CT" and facts.fat_hu is None:
        lo, hi = FAT_SEARCH_HU
        out.append(
            f"CT-number calibration not checked: no fat peak between {lo} and {hi} HU "
            "(no body fat in view, or the CT numbers are far off)"
        )
    if domain.noise_hu is not None and facts.modality.upper() == "CT" and facts.noise_hu is None:
        lo, hi = SOFT_TISSUE_HU
        out.append(f"noise not checked: no soft tissue between {lo:g} and {hi:g} HU in view")
    return out


@dataclass(frozen=True)
class MeasuredStructure:
    """What the model's output measured of one region label, as the checks need it."""

    label: str
    coverage: str  # complete | partial | not_found
    volume_ml: float | None
    mean_hu: float | None = None  # CT only


def _volume_outside(allowed: Range | None, volume: float | None, coverage: str) -> bool:
    """A whole structure outside its range; a partial one (a lower bound) only when it is
    already above the range."""
    if allowed is None or volume is None or allowed.contains(volume):
        return False
    return coverage == "complete" or (allowed.max is not None and volume > allowed.max)


def output_violations(domain: InputDomain | None, measured: list[MeasuredStructure]) -> list[str]:
    """Each structure of ``measured`` that lies wholly in view (coverage ``complete``)
    with a volume outside its declared ``structure_volumes_ml`` range (a partial one, a
    lower bound, only when already above the range), and each structure found whose mean
    HU lies outside its ``structure_hu`` range. A structure not found is not judged (it
    may be out of the scanned range)."""
    if domain is None:
        return []
    out = []
    for m in measured:
        allowed, volume = domain.structure_volumes_ml.get(m.label), m.volume_ml
        if _volume_outside(allowed, volume, m.coverage):
            out.append(
                f"{m.label} {volume:.0f} ml ({m.coverage}) outside the expected {allowed} "
                "ml: the images may not look like the studies the model was validated on"
            )
        hu_range = domain.structure_hu.get(m.label)
        if hu_range is not None and m.mean_hu is not None and not hu_range.contains(m.mean_hu):
            out.append(
                f"{m.label} reads {m.mean_hu:.0f} HU on average, outside the expected "
                f"{hu_range} HU: another contrast phase (or none) than the model was "
                "validated on"
            )
    return out


def output_unchecked(domain: InputDomain | None, measured: list[MeasuredStructure]) -> list[str]:
    """The contrast phase went unchecked when the model found none of its ``structure_hu``
    labels (said in the report, as a missing Body Part Examined is); one found is enough
    (a chest CT shows no kidneys, but its aorta)."""
    if domain is None or not domain.structure_hu:
        return []
    found = {m.label for m in measured if m.coverage != "not_found" and m.mean_hu is not None}
    if found & set(domain.structure_hu):
        return []
    names = ", ".join(domain.structure_hu)
    return [f"{names} not found: the mean HU that shows the contrast phase not checked"]


__all__ = [
    "BODY_HU",
    "FAT_SEARCH_HU",
    "INPUT_DOMAIN_UNCHECKED",
    "MAX_ELONGATION",
    "MAX_SLAB_MM",
    "MIN_BODY_SHARE",
    "MIN_BODY_THICKNESS_MM",
    "OUTSIDE_INPUT_DOMAIN",
    "SOFT_TISSUE_HU",
    "STRUCTURE_FIELDS",
    "AcquisitionFacts",
    "InputDomain",
    "Interval",
    "MeasuredStructure",
    "Range",
    "body_missing",
    "domain_unchecked",
    "domain_violations",
    "output_unchecked",
    "output_violations",
]
