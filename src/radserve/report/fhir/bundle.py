"""The report as one FHIR R4 Bundle, validated before it leaves radserve.

Models: ``fhir.resources.R4B`` (fhir.resources 8.x ships R5 by default; R4B is the R4
line and matches R4 for Patient, Device, ImagingStudy, Observation, DiagnosticReport).
The bundle is built as plain JSON, parsed back with those models (types, cardinality,
unknown fields) and checked by :mod:`radserve.report.fhir.checks` (value sets,
references) — any problem is a :class:`~radserve.errors.ReportError`.

Structure: Patient (identifier = Patient ID of the source header), one Device per model,
ImagingStudy (urn:oid study UID, source series, SEG/SR series), one Observation per organ
volume, per lesion a grouping Observation (finding code, body site = containing organ,
tracking UID) with ``hasMember`` long axis, short axis and volume Observations, and the
DiagnosticReport (final, RAD, LOINC 18748-4, conclusion text and SNOMED conclusion codes,
presentedForm: text summary + report.json). ``transaction`` bundles use conditional create
(``ifNoneExist`` on each identifier), so sending one twice creates nothing new.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

from radserve.errors import ReportError
from radserve.report.dicom import common
from radserve.report.fhir import resources as r
from radserve.report.fhir.checks import check_bundle
from radserve.report.json_report import report_json
from radserve.report.schema import Report

logger = logging.getLogger(__name__)

BundleType = Literal["transaction", "collection"]


def build_fhir_bundle(
    report: Report,
    patient: r.PatientLike,
    *,
    bundle_type: BundleType = "transaction",
    patient_identifier_system: str | None = None,
    dicom_results: Sequence[Any] = (),
    include_report_json: bool = True,
) -> dict[str, Any]:
    """The Bundle as a JSON-ready dict.

    Args:
        patient: the source header's patient data (:class:`radserve.ingest.PatientInfo`).
        patient_identifier_system: the issuer of Patient ID as a URI, when known.
        dicom_results: the SEG/SR datasets written for this report (listed as series).
        include_report_json: attach report.json (de-identified) as presentedForm.

    Raises:
        ReportError: the bundle breaks a FHIR rule (never quotes patient data).
    """
    subject = r.patient_entry(report, patient, patient_identifier_system)
    if not patient.patient_id:
        logger.warning("source has no Patient ID: FHIR Patient without identifier")
    study = r.imaging_study_entry(report, subject, dicom_results)
    devices = {
        (name, version): r.device_entry(report, name, version)
        for name, version in dict.fromkeys(
            [(m.name, m.version) for m in report.models]
            + [(m.model, m.model_version) for m in report.organ_measurements]
            + [(f.model, f.model_version) for f in report.findings]
        )
    }
    organs = common.organ_concepts(report)
    top: list[r.Entry] = []
    members: list[r.Entry] = []
    for organ in report.organ_measurements:
        device = devices[(organ.model, organ.model_version)]
        top.append(r.organ_observation(report, organ, subject, study, device))
    for finding in report.findings:
        device = devices[(finding.model, finding.model_version)]
        site = organs.get(finding.containing_organ or "")
        group, *parts = r.finding_observations(report, finding, site, subject, study, device)
        top.append(group)
        members += parts
    text = summary(report)
    diagnostic = r.diagnostic_report_entry(
        report, subject, study, top, text, report_json(report) if include_report_json else None
    )
    entries = [subject, *devices.values(), study, *top, *members, diagnostic]
    bundle: dict[str, Any] = {
        "resourceType": "Bundle",
        "id": r.local_id(report, "bundle"),
        "type": bundle_type,
        "timestamp": r.instant(report),
        "entry": [_entry(e, bundle_type) for e in entries],
    }
    validate_bundle(bundle)
    logger.info("FHIR bundle built: %d resources", len(entries))
    return bundle


def validate_bundle(bundle: dict[str, Any]) -> None:
    """Parse with fhir.resources R4B, then apply radserve's own checks."""
    try:
        from fhir.resources.R4B.bundle import Bundle
    except ImportError as exc:
        raise ReportError(
            "FHIR output needs the fhir.resources package (pip install 'fhir.resources>=8')"
        ) from exc
    from pydantic import ValidationError

    try:
        Bundle.model_validate(bundle)
    except ValidationError as exc:
        # Only locations and error types: the inputs may be patient data.
        where = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['type']}" for e in exc.errors()[:5]
        )
        raise ReportError(f"FHIR bundle does not validate against R4B: {where}") from None
    problems = check_bundle(bundle)
    if problems:
        raise ReportError("FHIR bundle breaks rules: " + "; ".join(problems[:5]))


def summary(report: Report) -> str:
    """Conclusion text: what was found and measured, no patient data."""
    lines = []
    if not report.findings:
        lines.append("No lesions detected.")
    else:
        n = len(report.findings)
        lines.append(f"{n} lesion{'s' if n != 1 else ''} detected:")
        for f in report.findings:
            where = f" in {f.containing_organ}" if f.containing_organ else ""
            lines.append(
                f"- {common.lesion_name(f.finding_id)} ({f.concept.meaning}{where}): "
                f"{f.longest_diameter_mm:.1f} x {f.short_axis_mm:.1f} mm, {f.volume_ml:.2f} ml"
            )
    for organ in report.organ_measurements:
        lines.append(f"{organ.concept.meaning} volume: {organ.volume_ml:.1f} ml")
    models = ", ".join(f"{m.name} {m.version}" for m in report.models)
    lines.append(
        f"AI result by radserve {report.radserve_version}"
        + (f" ({models})" if models else "")
        + "; not verified by a radiologist."
    )
    return "\n".join(lines)


def _entry(entry: r.Entry, bundle_type: BundleType) -> dict[str, Any]:
    item: dict[str, Any] = {"fullUrl": entry.full_url, "resource": entry.resource}
    if bundle_type == "transaction":
        request: dict[str, Any] = {"method": "POST", "url": entry.resource["resourceType"]}
        if entry.if_none_exist:
            request["ifNoneExist"] = entry.if_none_exist
        item["request"] = request
    return item
