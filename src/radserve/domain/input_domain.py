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


class Range(BaseModel):
    """A closed interval; either end may be open (None)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: float | None = Field(None, ge=0)
    max: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"range min {self.min} is above max {self.max}")
        return self

    def contains(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def __str__(self) -> str:
        lo = "-inf" if self.min is None else f"{self.min:g}"
        hi = "inf" if self.max is None else f"{self.max:g}"
        return f"[{lo}, {hi}]"


class InputDomain(BaseModel):
    """What the model was trained on. Every field is optional: an absent one is not
    checked. ``body_parts`` are Body Part Examined values (any of them); a study without
    Body Part Examined is not judged on it (the report notes that it could not be)."""

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
    structure_volumes_ml: dict[str, Range] = {}

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


def output_violations(
    domain: InputDomain | None, measured: list[tuple[str, str, float | None]]
) -> list[str]:
    """Each structure of ``measured`` (label, coverage, volume ml) that lies wholly in view
    (coverage ``complete``) with a volume outside its declared ``structure_volumes_ml``
    range. A partial structure (a lower bound) is judged only when it is already above
    the range; a structure not found is not judged (it may be out of the scanned range)."""
    if domain is None or not domain.structure_volumes_ml:
        return []
    out = []
    for label, coverage, volume in measured:
        allowed = domain.structure_volumes_ml.get(label)
        if allowed is None or volume is None or allowed.contains(volume):
            continue
        if coverage == "complete" or (allowed.max is not None and volume > allowed.max):
            out.append(
                f"{label} {volume:.0f} ml ({coverage}) outside the expected {allowed} ml: "
                "the images may not look like the studies the model was validated on"
            )
    return out


__all__ = [
    "OUTSIDE_INPUT_DOMAIN",
    "AcquisitionFacts",
    "InputDomain",
    "Range",
    "domain_violations",
    "output_violations",
]
