"""Predictions -> findings and measurements: component clean-up, RECIST diameters,
organ volumes, and the finding label map the report writers draw from."""

from radserve.postprocess.components import clean_labels
from radserve.postprocess.diameters import FindingAxes, axial_diameters
from radserve.postprocess.findings import (
    LesionFindings,
    extract_findings,
    find_lesions,
    organ_measurements,
)

__all__ = [
    "FindingAxes",
    "LesionFindings",
    "axial_diameters",
    "clean_labels",
    "extract_findings",
    "find_lesions",
    "organ_measurements",
]
