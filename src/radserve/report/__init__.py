"""Findings -> outputs: the versioned JSON report, NIfTI label maps and PNG key images.

DICOM SEG/SR and FHIR writers live here too and are driven from :class:`Report` plus
the label maps it points to.
"""

from radserve.report.json_report import (
    read_report,
    report_json_schema,
    write_json_schema,
    write_report,
)
from radserve.report.keyimages import render_finding, render_overview, write_key_images
from radserve.report.nifti import read_nifti, write_label_map, write_nifti
from radserve.report.schema import (
    SCHEMA_VERSION,
    Geometry,
    KeyImageOutput,
    LabelMapOutput,
    ModelRun,
    Outputs,
    PipelineInfo,
    Report,
    ReportWarning,
    RuntimeInfo,
    Segment,
    SeriesRef,
    SeriesSelection,
    StudyInfo,
    finding_segments,
    organ_segments,
)

__all__ = [
    "SCHEMA_VERSION",
    "Geometry",
    "KeyImageOutput",
    "LabelMapOutput",
    "ModelRun",
    "Outputs",
    "PipelineInfo",
    "Report",
    "ReportWarning",
    "RuntimeInfo",
    "Segment",
    "SeriesRef",
    "SeriesSelection",
    "StudyInfo",
    "finding_segments",
    "organ_segments",
    "read_nifti",
    "read_report",
    "render_finding",
    "render_overview",
    "report_json_schema",
    "write_json_schema",
    "write_key_images",
    "write_label_map",
    "write_nifti",
    "write_report",
]
