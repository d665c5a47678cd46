"""What a pipeline found: coded, measured, traceable to the model that produced it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CodedConcept(BaseModel):
    """A code from a coding scheme, e.g. SNOMED CT ``10200004`` "Liver"."""

    model_config = ConfigDict(frozen=True)

    value: str
    scheme: str = "SCT"
    meaning: str


class OrganMeasurement(BaseModel):
    """An organ's segmented volume."""

    model_config = ConfigDict(frozen=True)

    label: str
    concept: CodedConcept
    label_value: int
    volume_ml: float
    mean_hu: float | None = None
    model: str
    model_version: str


class Finding(BaseModel):
    """One lesion: a connected component of a detection/segmentation model's output."""

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
    containing_organ: str | None = None
    mean_hu: float | None = None
    confidence: float = Field(ge=0.0, le=1.0)
    model: str
    model_version: str
    precision: str = "fp32"
