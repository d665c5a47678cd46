"""What a pipeline found: coded, measured, traceable to the model that produced it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CodedConcept(BaseModel):
    """A code from a coding scheme, e.g. SNOMED CT ``10200004`` "Liver"."""

    model_config = ConfigDict(frozen=True)

    value: str
    scheme: str = "SCT"
    meaning: str


Coverage = Literal["complete", "partial", "not_found"]
Edge = Literal["first_slice", "last_slice", "first_row", "last_row", "first_column", "last_column"]


class OrganMeasurement(BaseModel):
    """An organ's segmented volume, and how much of the organ the volume held.

    ``coverage``: ``complete`` — the segmentation touches no edge of the assessed
    volume; ``partial`` — it touches ``edges`` (the organ runs out of the scanned range
    or field of view), so ``volume_ml`` is a lower bound; ``not_found`` — no voxel
    (outside the scanned range, absent, or missed): not assessed, ``volume_ml`` is None,
    never a measured 0.
    """

    model_config = ConfigDict(frozen=True)

    label: str
    concept: CodedConcept
    label_value: int
    coverage: Coverage = "complete"
    edges: tuple[Edge, ...] = Field(
        default=(), description="edges of the assessed volume the segmentation touches"
    )
    volume_ml: float | None = Field(description="None when not_found; a lower bound if partial")
    mean_hu: float | None = None
    model: str
    model_version: str

    @model_validator(mode="after")
    def _consistent(self) -> OrganMeasurement:
        if (self.volume_ml is None) != (self.coverage == "not_found"):
            raise ValueError("volume_ml is None exactly when coverage is not_found")
        if (self.coverage == "partial") != bool(self.edges):
            raise ValueError("coverage is partial exactly when edges are touched")
        return self


class Finding(BaseModel):
    """One lesion: a connected component of a detection/segmentation model's output.

    ``coverage``: ``partial`` when the component touches ``edges`` of the assessed
    volume (first/last slice, row or column): the lesion may go on outside the scan,
    so its volume and RECIST diameters are lower bounds; ``complete`` otherwise.
    """

    model_config = ConfigDict(frozen=True)

    finding_id: int = Field(description="1-based, stable within a report; the tracking id")
    label: str
    concept: CodedConcept
    label_value: int = Field(description="value of this finding in the report's label map")
    volume_ml: float
    longest_diameter_mm: float = Field(description="longest axial diameter (RECIST)")
    short_axis_mm: float = Field(description="longest diameter perpendicular to it, same slice")
    centroid_mm: tuple[float, float, float] = Field(description="LPS patient coordinates")
    centroid_voxel: tuple[float, float, float] = Field(description="(slice, row, column)")
    key_slice_index: int = Field(description="slice with the longest axial diameter")
    coverage: Literal["complete", "partial"] = Field(
        default="complete", description="partial: volume and diameters are lower bounds"
    )
    edges: tuple[Edge, ...] = Field(
        default=(), description="edges of the assessed volume the finding touches"
    )
    containing_organ: str | None = None
    mean_hu: float | None = None
    confidence: float = Field(ge=0.0, le=1.0)
    model: str
    model_version: str
    precision: str = "fp32"

    @model_validator(mode="after")
    def _consistent(self) -> Finding:
        if (self.coverage == "partial") != bool(self.edges):
            raise ValueError("coverage is partial exactly when edges are touched")
        return self


class Classification(BaseModel):
    """A classification step's answer for the study: its most probable class.

    ``probability`` is that class's probability aggregated over the slices the model
    read; ``probabilities`` holds every label's. ``positive``: the probability reached
    the model's ``classification.min_probability``, so the class is reported as a
    finding (SR, FHIR); otherwise the report keeps the scores and says nothing was found.
    """

    model_config = ConfigDict(frozen=True)

    step: str = Field(description="the pipeline step that classified")
    label: str = Field(description="the most probable class (model label name)")
    concept: CodedConcept
    label_value: int
    probability: float = Field(ge=0.0, le=1.0)
    positive: bool
    probabilities: dict[str, float] = Field(description="every label's probability, by name")
    aggregate: Literal["mean", "max"] = Field(description="how the slice scores were combined")
    slices: int = Field(ge=0, description="slices the model read")
    model: str
    model_version: str
    precision: str = "fp32"
