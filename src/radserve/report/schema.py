"""The radserve JSON report, schema version 2.7: what was found, by which model, on what.

One ``Report`` per job. It is the single source the other writers work from: DICOM SEG
(``outputs.label_maps`` with their ``segments`` + the NIfTI label maps), DICOM SR TID
1500 (``findings``, ``finding_axes`` with RECIST endpoints, ``geometry`` with the source
SOP Instance UID of every slice, ``models`` for the algorithm identification) and the
FHIR DiagnosticReport (``study``, ``findings``, ``organ_measurements``).

Privacy: the report is de-identified except for DICOM UIDs and the accession number.
It carries no patient name, patient ID, birth date, sex or other demographics, and no
free-text DICOM descriptions (they may hold names). Writers that need patient data
(DICOM SEG/SR, FHIR) copy it from the source headers at write time. Every model here
forbids unknown fields, so such data cannot slip in by accident.

Versioning: ``schema_version`` changes its minor number for additive changes and its
major number when a field is renamed, removed or changes meaning. Readers reject a
major version they do not know. 2.0: an organ measurement has ``coverage`` and
``edges``, and ``volume_ml`` is null for an organ not found (1.0 wrote a measured 0);
1.x reports are read by migrating them (:func:`radserve.report.json_report.parse_report`).
2.1: one label map per pipeline step (``outputs.label_maps[].step`` names it), the
``structures`` kind for maps of ``kind: structure`` labels, findings and organ
measurements of every step (not only the last of each kind); 2.0 reports read as 2.1
(nothing in them changes meaning).
2.2: ``classifications``, the answer of each classification step (its most probable
class, the probability, every label's probability); 2.0 and 2.1 reports read as 2.2.
2.3: a finding has ``coverage`` (``partial`` when it touches an edge of the volume:
its diameters and volume are lower bounds) and ``edges``; older 2.x reports read as
2.3 with every finding ``complete`` (not checked then).
2.4: ``geometry.source_frame_numbers``, the frame of each slice when the series is one
Enhanced (multi-frame) instance, so DICOM SEG/SR reference frames; older 2.x reports
read as 2.4 without it (single-frame sources).
2.5: a series reference (``series_selection.selected``, ``.rejected[]``) has
``instance_count``, the DICOM instances (files) of the series as received; older 2.x
reports read as 2.5 with it null (not recorded then).
2.6: ``paused``, of each stage in ``timings`` the seconds a routine study's stage spent
paused while URGENT work ran (``radserve serve`` only); older 2.x reports read as 2.6
with it empty (not recorded then).
2.7: ``lineage.report_uid``, the identifier of the AI report a result is a version of
(its FHIR DiagnosticReport's), per lineage: under ``security.visibility`` each site's
own; older 2.x reports read as 2.7 with it null (derived from the study and pipeline,
as then).
``docs/report-schema.json`` is the JSON Schema export
(:func:`radserve.report.json_report.write_json_schema`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from radserve import __version__
from radserve.domain import Classification, CodedConcept, Finding, OrganMeasurement, Volume
from radserve.models.manifest import ModelSpec
from radserve.postprocess.diameters import FindingAxes

SCHEMA_VERSION = "2.7"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StudyInfo(_Model):
    """Which study and series were read. UIDs and accession only; no demographics."""

    study_instance_uid: str | None = None
    series_instance_uid: str | None = None
    accession_number: str | None = None
    modality: str | None = Field(None, description="DICOM Modality of the series, e.g. CT")
    study_date: dt.date | None = None


class PipelineInfo(_Model):
    name: str
    version: str


class ModelRun(_Model):
    """One model as it actually ran: the variant, its file hash and where it ran."""

    name: str
    version: str
    precision: str = Field("fp32", description="fp32 | fp16 | int8 | bf16")
    onnx_sha256: str | None = Field(None, description="SHA-256 of the ONNX file that ran")
    execution_provider: str | None = Field(None, description="e.g. CUDAExecutionProvider")


class RuntimeInfo(_Model):
    providers: list[str] = Field(default_factory=list, description="ONNX Runtime providers")
    threads: int | None = Field(None, description="intra-op threads")
    device: str | None = Field(None, description="e.g. 'cpu', 'cuda:0'")


class SeriesRef(_Model):
    """A candidate series, by UID; ``reason`` says why it was not used."""

    series_instance_uid: str
    series_number: int | None = None
    modality: str | None = None
    reason: str | None = None
    instance_count: int | None = Field(
        None, ge=0, description="DICOM instances (files) of the series as received (2.5)"
    )


class SeriesSelection(_Model):
    selected: SeriesRef | None = None
    rejected: list[SeriesRef] = Field(default_factory=list)


class Geometry(_Model):
    """The input volume's grid; every voxel index in this report refers to it."""

    shape: tuple[int, int, int] = Field(description="(slice, row, column)")
    spacing: tuple[float, float, float] = Field(description="mm along (slice, row, column)")
    affine: list[list[float]] = Field(
        description="4x4: (slice, row, column, 1) -> LPS mm (see radserve.domain.Volume)"
    )
    frame_of_reference_uid: str | None = None
    source_sop_instance_uids: list[str] = Field(
        default_factory=list,
        description="SOP Instance UID of each slice, index = slice (SR/SEG references)",
    )
    source_frame_numbers: list[int | None] = Field(
        default_factory=list,
        description="1-based frame number of each slice in its Enhanced (multi-frame) "
        "instance, index = slice, null for a single-frame instance; empty when no slice is "
        "a frame (2.4)",
    )

    @classmethod
    def from_volume(cls, volume: Volume, frame_numbers: Sequence[int | None] = ()) -> Geometry:
        """``frame_numbers``: each slice's frame in its Enhanced instance (None: single-frame)."""
        return cls(
            shape=volume.shape,
            spacing=volume.spacing,
            affine=np.asarray(volume.affine, dtype=float).tolist(),
            frame_of_reference_uid=volume.frame_of_reference_uid,
            source_sop_instance_uids=list(volume.source_sop_instance_uids),
            source_frame_numbers=list(frame_numbers)
            if any(n is not None for n in frame_numbers)
            else [],
        )


class Segment(_Model):
    """One value of a label map, described well enough to write a DICOM SEG segment."""

    value: int = Field(ge=1)
    label: str = Field(description="model label name, e.g. 'liver lesion'")
    concept: CodedConcept = Field(description="Segmented Property Type")
    category: CodedConcept = Field(description="Segmented Property Category")
    color: tuple[int, int, int] = (255, 0, 0)
    model: str
    model_version: str
    finding_id: int | None = Field(None, description="set when the value is one finding")


class LabelMapOutput(_Model):
    """A NIfTI label map on the input grid (``geometry``) and what its values mean.

    ``organs`` / ``structures``: values are the model's region labels (``structures`` when
    any of them is ``kind: structure``); ``findings``: value ``i`` is finding ``i``.
    """

    path: str = Field(description="POSIX path relative to the report's folder")
    kind: Literal["findings", "organs", "structures"]
    segments: list[Segment] = Field(default_factory=list)
    step: str | None = Field(None, description="the pipeline step that wrote it (2.1)")


class KeyImageOutput(_Model):
    path: str = Field(description="POSIX path relative to the report's folder")
    kind: Literal["finding", "overview"]
    slice_index: int
    finding_id: int | None = None


class Outputs(_Model):
    label_maps: list[LabelMapOutput] = Field(default_factory=list)
    key_images: list[KeyImageOutput] = Field(default_factory=list)


class ReportWarning(_Model):
    """Something a reader should know (an ingest flag, a rule not applied); no PHI."""

    code: str = Field(description="stable, machine-readable, e.g. 'missing_slice'")
    message: str
    stage: str | None = Field(None, description="ingest | inference | postprocess | ...")


class ResultRef(_Model):
    """A DICOM result instance radserve wrote (for Predecessor Documents references)."""

    study_instance_uid: str
    series_instance_uid: str
    sop_class_uid: str
    sop_instance_uid: str


class Lineage(_Model):
    """Where this result stands among the results for its study (same pipeline; under
    ``security.visibility`` among those of its submitter's site or submitter).

    Generation 1 is the first; a later one supersedes the one before it (a study re-run
    with more or changed instances): its SR references the predecessor's SR, its FHIR
    DiagnosticReport amends the same report, and a lesion found again keeps its
    tracking UID."""

    generation: int = Field(1, ge=1)
    supersedes_job_id: str | None = Field(None, description="the job of the previous result")
    predecessor_sr: ResultRef | None = None
    tracking_uids: dict[str, str] = Field(
        default_factory=dict,
        description="tracking UID per finding/organ key (finding:<id>, organ:<model>:<value>)",
    )
    report_uid: str | None = Field(
        None,
        description=(
            "identifier of the AI report this result is a version of (the FHIR "
            "DiagnosticReport's), the same in every generation of its lineage; null: "
            "derived from the study and pipeline (2.7)"
        ),
    )


class Report(_Model):
    """A job's result. Findings are numbered 1..n; ``finding_id`` is the tracking id."""

    schema_version: Literal["2.7"] = SCHEMA_VERSION
    generated_at: AwareDatetime = Field(description="ISO 8601 with time zone (UTC)")
    radserve_version: str = __version__
    job_id: str | None = None
    study: StudyInfo = StudyInfo()
    pipeline: PipelineInfo
    models: list[ModelRun] = Field(default_factory=list)
    runtime: RuntimeInfo = RuntimeInfo()
    series_selection: SeriesSelection = SeriesSelection()
    geometry: Geometry
    findings: list[Finding] = Field(default_factory=list)
    finding_axes: list[FindingAxes] = Field(
        default_factory=list, description="RECIST endpoints per finding (by finding_id)"
    )
    organ_measurements: list[OrganMeasurement] = Field(default_factory=list)
    classifications: list[Classification] = Field(
        default_factory=list, description="one per classification step (2.2)"
    )
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per stage")
    paused: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "of a stage's seconds in timings, those it spent paused while URGENT work ran "
            "(a routine study under radserve serve); a stage not named did not pause"
        ),
    )
    warnings: list[ReportWarning] = Field(default_factory=list)
    outputs: Outputs = Outputs()
    lineage: Lineage | None = None


def finding_segments(findings: list[Finding], spec: ModelSpec) -> list[Segment]:
    """Segments of a findings label map: value ``i`` is finding ``i``."""
    out = []
    for f in findings:
        label = spec.label(f.label)
        out.append(
            Segment(
                value=f.label_value,
                label=f.label,
                concept=f.concept,
                category=label.category,
                color=label.color,
                model=f.model,
                model_version=f.model_version,
                finding_id=f.finding_id,
            )
        )
    return out


def organ_segments(spec: ModelSpec) -> list[Segment]:
    """Segments of a region label map: the manifest's organ/structure labels, by value."""
    return [
        Segment(
            value=label.value,
            label=label.name,
            concept=label.concept,
            category=label.category,
            color=label.color,
            model=spec.name,
            model_version=spec.version,
        )
        for label in spec.region_labels
    ]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
