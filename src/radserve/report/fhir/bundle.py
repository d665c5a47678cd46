"""The report as one FHIR R4 Bundle, validated before it leaves radserve.

Models: ``fhir.resources.R4B`` (fhir.resources 8.x ships R5 by default; R4B is the R4
line and matches R4 for Patient, Device, ImagingStudy, Observation, DiagnosticReport).
The bundle is built as plain JSON, parsed back with those models (types, cardinality,
unknown fields) and checked by :mod:`radserve.report.fhir.checks` (value sets,
references) — any problem is a :class:`~radserve.errors.ReportError`.

Structure: Patient (identifier = Patient ID of the source header, its system from the
issuer: :mod:`radserve.report.fhir.patient`), one Device per model,
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

from radserve.domain import Classification
from radserve.domain.findings import Finding
from radserve.errors import ReportError
from radserve.report.dicom import common
from radserve.report.fhir import resources as r
from radserve.report.fhir.checks import check_bundle
from radserve.report.fhir.patient import IdentifierSystems
from radserve.report.json_report import report_json
from radserve.report.schema import Report
from radserve.report.wording import (
    edges_text,
    no_findings_text,
    organ_volume_text,
    reader_notes,
    site_text,
)

logger = logging.getLogger(__name__)

BundleType = Literal["transaction", "collection"]


def build_fhir_bundle(
    report: Report,
    patient: r.PatientLike,
    *,
    bundle_type: BundleType = "transaction",
    identifier_systems: IdentifierSystems | None = None,
    dicom_results: Sequence[Any] = (),
    include_report_json: bool = True,
) -> dict[str, Any]:
    """The Bundle as a JSON-ready dict.

    Args:
        patient: the source header's patient data (:class:`radserve.ingest.PatientInfo`).
        identifier_systems: where Patient.identifier.system comes from (the
            ``fhir.patient_identifier_system`` / ``fhir.issuer_systems`` settings).
        dicom_results: the SEG/SR datasets written for this report (listed as series).
        include_report_json: attach report.json (de-identified) as presentedForm.

    Raises:
        ReportError: the bundle breaks a FHIR rule (never quotes patient data).
    """
    core = ReportResources(
        report, patient, identifier_systems=identifier_systems, dicom_results=dicom_results
    )
    subject, study = core.subject, core.study
    top: list[r.Entry] = []
    members: list[r.Entry] = []
    for organ in report.organ_measurements:
        device = core.devices[(organ.model, organ.model_version)]
        top.append(r.organ_observation(report, organ, subject, study, device))
    for finding in report.findings:
        group, *parts = core.finding(finding)
        top.append(group)
        members += parts
    devices = core.devices
    for classification in report.classifications:
        if classification.positive:
            device = devices.get((classification.model, classification.model_version))
            top.append(r.classification_observation(report, classification, subject, study, device))
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


class ReportResources:
    """The Patient, Devices and ImagingStudy of a report and each finding's Observations:
    the one definition that both the report's Bundle and a critical finding's FHIR push
    (:mod:`radserve.report.fhir.critical`) are built from, so the push, sent first,
    carries exactly the resources (same ids, same conditional creates) the Bundle sent
    later finds. Cheap: no validation, no DiagnosticReport, no report.json; the push
    builds only what its Communication references instead of the whole report."""

    def __init__(
        self,
        report: Report,
        patient: r.PatientLike,
        *,
        identifier_systems: IdentifierSystems | None = None,
        dicom_results: Sequence[Any] = (),
    ) -> None:
        self.report = report
        self.subject = r.patient_entry(report, patient, identifier_systems or IdentifierSystems())
        if not patient.patient_id:
            logger.warning("source has no Patient ID: FHIR Patient without identifier")
        self.study = r.imaging_study_entry(report, self.subject, dicom_results)
        self.devices = {
            (name, version): r.device_entry(report, name, version)
            for name, version in dict.fromkeys(
                [(m.name, m.version) for m in report.models]
                + [(m.model, m.model_version) for m in report.organ_measurements]
                + [(f.model, f.model_version) for f in report.findings]
            )
        }
        self._organs = common.organ_concepts(report)

    def finding(self, finding: Finding) -> list[r.Entry]:
        """The finding's grouping Observation, then its member Observations."""
        device = self.devices[(finding.model, finding.model_version)]
        site = self._organs.get(finding.containing_organ or "")
        return r.finding_observations(self.report, finding, site, self.subject, self.study, device)

    def diagnostic_report_reference(self) -> dict[str, Any]:
        """The report's DiagnosticReport by identifier (a logical reference), for a
        resource sent before it exists on the server."""
        identifier = r.oid_identifier(r.diagnostic_report_uid(self.report))
        return {"type": "DiagnosticReport", "identifier": identifier}

    @staticmethod
    def transaction_entry(entry: r.Entry) -> dict[str, Any]:
        """``entry`` as the report's transaction Bundle writes it."""
        return _entry(entry, "transaction")


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
        lines.append(no_findings_text(report.warnings))
    else:
        n = len(report.findings)
        lines.append(f"{n} lesion{'s' if n != 1 else ''} detected:")
        organs = common.organ_concepts(report)
        for f in report.findings:
            where = site_text(f, organs)
            least = "at least " if f.coverage == "partial" else ""
            cut = " (truncated: it " + edges_text(f) + ")" if f.coverage == "partial" else ""
            lines.append(
                f"- {common.lesion_name(f.finding_id)} ({f.concept.meaning}{where}): {least}"
                f"{f.longest_diameter_mm:.1f} x {f.short_axis_mm:.1f} mm, {f.volume_ml:.2f} ml"
                f"{cut}"
            )
    lines += [organ_volume_text(organ) for organ in report.organ_measurements]
    lines += [classification_text(c) for c in report.classifications]
    models = ", ".join(f"{m.name} {m.version}" for m in report.models)
    lines += lineage_lines(report)
    lines += [f"Note: {note[0].upper()}{note[1:]}." for note in reader_notes(report.warnings)]
    lines.append(
        f"AI result by radserve {report.radserve_version}"
        + (f" ({models})" if models else "")
        + "; not verified by a radiologist."
    )
    return "\n".join(lines)


def classification_text(classification: Classification) -> str:
    """One classification step's answer for the conclusion."""
    p = f"probability {classification.probability:.2f}"
    if classification.positive:
        return f"{classification.step}: {classification.concept.meaning} ({p})."
    return (
        f"{classification.step}: no class reached its threshold (most probable: "
        f"{classification.concept.meaning}, {p})."
    )


def lineage_lines(report: Report) -> list[str]:
    """What a reader of the conclusion must know about a re-run: which version this is."""
    g = common.generation(report)
    if g == 1:
        return []
    return [
        f"Version {g} of this AI result (the study was analysed again with changed or "
        f"additional images); it replaces version {g - 1}."
    ]


def _entry(entry: r.Entry, bundle_type: BundleType) -> dict[str, Any]:
    item: dict[str, Any] = {"fullUrl": entry.full_url, "resource": entry.resource}
    if bundle_type == "transaction":
        if entry.update and entry.if_none_exist:
            return _update_entry(entry)
        request: dict[str, Any] = {"method": "POST", "url": entry.resource["resourceType"]}
        if entry.if_none_exist:
            request["ifNoneExist"] = entry.if_none_exist
        item["request"] = request
    return item


def _update_entry(entry: r.Entry) -> dict[str, Any]:
    """A conditional update: the server amends the resource it holds with that
    identifier (or creates it). No ``id`` in the resource: the server's id is kept."""
    resource = {k: v for k, v in entry.resource.items() if k != "id"}
    url = f"{resource['resourceType']}?{entry.if_none_exist}"
    return {
        "fullUrl": entry.full_url,
        "resource": resource,
        "request": {"method": "PUT", "url": url},
    }
