"""Text notes in radserve's TID 1500 SRs: the failure notice, study-completeness warnings
and the series of the study that were not analysed, with the reason.

TID 1500 (Measurement Report) allows, beside its Imaging Measurements, a root-level
"Qualitative Evaluations" container (UMLS C0034375) of CODE and TEXT items; highdicom
0.28's :class:`~highdicom.sr.MeasurementReport` has no argument for it, so the container
is appended to the root's content after highdicom built it. The concepts radserve needs
that DICOM does not code (the analysis failed; which warning) are in radserve's private
coding scheme ``99RADSERVE``, declared in the Coding Scheme Identification Sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import highdicom as hd
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code

SCHEME = "99RADSERVE"
QUALITATIVE_EVALUATIONS = Code("C0034375", "UMLS", "Qualitative Evaluations")
ANALYSIS_STATUS = Code("analysis-status", SCHEME, "AI analysis status")
ANALYSIS_FAILED = Code("analysis-failed", SCHEME, "AI analysis failed")
ERROR_CODE = Code("error-code", SCHEME, "Error code")
FAILURE_REASON = Code("failure-reason", SCHEME, "Failure reason")
# a series of the study the result does not cover: TEXT = its number, UID and the reason
SERIES_NOT_ANALYSED = Code("series-skipped", SCHEME, "Series not analysed")
# a warning a reader of the result must see: TEXT "Quality Issue" = the warning's message
QUALITY_ISSUE = codes.DCM.QualityIssue


def evaluations(items: Sequence[hd.sr.ContentItem]) -> hd.sr.ContainerContentItem:
    """The root-level Qualitative Evaluations container of TID 1500 holding ``items``."""
    container = hd.sr.ContainerContentItem(
        name=QUALITATIVE_EVALUATIONS, relationship_type=hd.sr.RelationshipTypeValues.CONTAINS
    )
    container.ContentSequence = hd.sr.ContentSequence(items, is_root=False)
    return container


def text(name: Code, value: str) -> hd.sr.TextContentItem:
    return hd.sr.TextContentItem(
        name=name, value=value, relationship_type=hd.sr.RelationshipTypeValues.CONTAINS
    )


def code(name: Code, value: Code) -> hd.sr.CodeContentItem:
    return hd.sr.CodeContentItem(
        name=name, value=value, relationship_type=hd.sr.RelationshipTypeValues.CONTAINS
    )


def append_to_root(root: Dataset, container: hd.sr.ContainerContentItem) -> None:
    """Add ``container`` as the last child of the report's root content item."""
    root.ContentSequence.append(container)


def declare_scheme(dataset: Dataset) -> None:
    """Name radserve's private coding scheme (SOP Common module, Type 3)."""
    item = Dataset()
    item.CodingSchemeDesignator = SCHEME
    item.CodingSchemeName = "radserve codes"
    item.CodingSchemeResponsibleOrganization = "radserve"
    existing = [
        i
        for i in dataset.get("CodingSchemeIdentificationSequence", [])
        if i.get("CodingSchemeDesignator") != SCHEME
    ]
    dataset.CodingSchemeIdentificationSequence = [*existing, item]


__all__ = [
    "ANALYSIS_FAILED",
    "ANALYSIS_STATUS",
    "ERROR_CODE",
    "FAILURE_REASON",
    "QUALITY_ISSUE",
    "SCHEME",
    "SERIES_NOT_ANALYSED",
    "append_to_root",
    "code",
    "declare_scheme",
    "evaluations",
    "text",
]
