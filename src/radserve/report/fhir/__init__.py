"""FHIR R4 (fhir.resources R4B models) for a report: Patient, ImagingStudy, Observations,
DiagnosticReport in one Bundle. Needs the ``fhir.resources`` package (8.x) at run time."""

from radserve.report.fhir.bundle import build_fhir_bundle, summary, validate_bundle
from radserve.report.fhir.checks import check_bundle

__all__ = ["build_fhir_bundle", "check_bundle", "summary", "validate_bundle"]
