"""FHIR R4 resources of one report, as plain JSON-ready dicts.

Every resource carries an identifier derived from the report, so a transaction can be
sent twice without creating duplicates (``ifNoneExist``). The lesion's Observation
carries the DICOM tracking UID of its SEG segment and SR group, so FHIR, SEG and SR name
the same lesion the same way.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pydicom.uid import generate_uid

from radserve.domain import Classification, CodedConcept, Finding, OrganMeasurement
from radserve.errors import ReportError
from radserve.report.dicom import common
from radserve.report.fhir.patient import (
    IdentifierSystems,
    PatientLike,
    birth_date,
    gender,
    human_names,
    patient_identifier,
)
from radserve.report.schema import Report
from radserve.report.wording import coverage_note, finding_coverage_note

JSON = dict[str, Any]

SNOMED = "http://snomed.info/sct"
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
DCM = "http://dicom.nema.org/resources/ontology/DCM"
DICOM_UID = "urn:dicom:uid"
URI = "urn:ietf:rfc:3986"
V2_0074 = "http://terminology.hl7.org/CodeSystem/v2-0074"
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"
OBS_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
DATA_ABSENT = "http://terminology.hl7.org/CodeSystem/data-absent-reason"
SYSTEMS = {"SCT": SNOMED, "SRT": SNOMED, "LN": LOINC, "DCM": DCM, "UCUM": UCUM}

REPORT_CODE = {"system": LOINC, "code": "18748-4", "display": "Diagnostic imaging study"}
VOLUME = {"system": SNOMED, "code": "118565006", "display": "Volume"}
LONG_AXIS = {"system": SNOMED, "code": "103339001", "display": "Long axis"}
SHORT_AXIS = {"system": SNOMED, "code": "103340004", "display": "Short axis"}


@dataclass(frozen=True)
class Entry:
    """A resource, its bundle-local URL and the search that finds an existing copy."""

    resource: JSON
    if_none_exist: str | None = None
    # conditional update (PUT <type>?<if_none_exist>): a re-run amends what is there
    update: bool = False

    @property
    def full_url(self) -> str:
        return f"urn:uuid:{self.resource['id']}"

    @property
    def ref(self) -> JSON:
        return {"reference": self.full_url}


def local_id(report: Report, *parts: str) -> str:
    """A UUID that is the same every time the same report is exported."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, common.report_uid(report, "fhir", *parts)))


def coding(concept: CodedConcept) -> JSON:
    system = SYSTEMS.get(concept.scheme.upper())
    if system is None:
        raise ReportError(
            f"coding scheme {concept.scheme!r} has no FHIR system here; "
            f"use one of {sorted(SYSTEMS)} in the model manifest"
        )
    return {"system": system, "code": concept.value, "display": concept.meaning}


def oid_identifier(uid: str, **extra: Any) -> JSON:
    return {"system": DICOM_UID, "value": f"urn:oid:{uid}", **extra}


def _search(identifier: JSON) -> str:
    """The ``ifNoneExist`` query that finds a resource by this identifier."""
    token = quote(identifier["value"], safe=":.@-_")
    if identifier.get("system"):
        token = f"{quote(identifier['system'], safe=':/.-_')}|{token}"
    return f"identifier={token}"


def identifier_search(identifier: JSON) -> str:
    """The ``ifNoneExist`` query of ``identifier`` (for resources built elsewhere)."""
    return _search(identifier)


def instant(report: Report) -> str:
    """``generated_at`` as a FHIR instant in UTC (the form fhir.resources writes back)."""
    return report.generated_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


# --- Patient, Device, ImagingStudy ------------------------------------------------------------
def patient_entry(report: Report, patient: PatientLike, systems: IdentifierSystems) -> Entry:
    """The Patient; conditional create only for an identifier with a system (see
    :mod:`radserve.report.fhir.patient`)."""
    resource: JSON = {"resourceType": "Patient", "id": local_id(report, "patient")}
    search = None
    identifier = patient_identifier(patient, systems)
    if identifier is not None:
        resource["identifier"] = [identifier]
        if identifier.get("system"):
            search = _search(identifier)
    if names := human_names(patient.patient_name):
        resource["name"] = names
    resource["gender"] = gender(patient)
    if birth := birth_date(patient):
        resource["birthDate"] = birth
    return Entry(resource, search)


def device_entry(report: Report, name: str, version: str) -> Entry:
    identifier = {"system": "urn:radserve:model", "value": f"{name}@{version}"}
    return Entry(
        {
            "resourceType": "Device",
            "id": local_id(report, "device", name, version),
            "identifier": [identifier],
            "manufacturer": common.MANUFACTURER,
            "deviceName": [{"name": name, "type": "model-name"}],
            "type": {"text": "AI model run by radserve"},
            "version": [{"value": version}],
        },
        _search(identifier),
    )


def describes_dicom_study(report: Report) -> bool:
    """Whether ``report`` is of a DICOM study (a NIfTI volume has none): only such a report
    has a FHIR Bundle, whose ImagingStudy is identified by the Study Instance UID."""
    return bool(report.study.study_instance_uid)


def imaging_study_entry(report: Report, subject: Entry, results: Sequence[Any]) -> Entry:
    """The study: the source series (series level only) and the SEG/SR series radserve wrote."""
    study_uid = report.study.study_instance_uid
    if not study_uid:
        raise ReportError("the report has no Study Instance UID; FHIR ImagingStudy needs one")
    identifier = oid_identifier(study_uid)
    identifiers = [identifier]
    if report.study.accession_number:
        identifiers.append(
            {
                "type": {"coding": [{"system": V2_0203, "code": "ACSN"}]},
                "value": report.study.accession_number,
            }
        )
    series = [_source_series(report)] if report.study.series_instance_uid else []
    series += _result_series(results)
    modalities = {s["modality"]["code"]: s["modality"] for s in series}
    resource: JSON = {
        "resourceType": "ImagingStudy",
        "id": local_id(report, "imaging-study"),
        "identifier": identifiers,
        "status": "available",
        "subject": subject.ref,
        "numberOfSeries": len(series),
        "numberOfInstances": sum(s.get("numberOfInstances", 0) for s in series),
    }
    if modalities:
        resource["modality"] = list(modalities.values())
    if report.study.study_date:
        resource["started"] = report.study.study_date.isoformat()
    if series:
        resource["series"] = series
    return Entry(resource, _search(identifier))


def _source_series(report: Report) -> JSON:
    selected = report.series_selection.selected
    series: JSON = {
        "uid": report.study.series_instance_uid,
        "modality": {"system": DCM, "code": report.study.modality or "OT"},
        # distinct instances: an Enhanced series is one instance holding every slice
        "numberOfInstances": len(set(report.geometry.source_sop_instance_uids)),
    }
    if selected is not None and selected.series_number is not None:
        series["number"] = selected.series_number
    return series


def _result_series(results: Sequence[Any]) -> list[JSON]:
    """SEG and SR instances radserve wrote, grouped by series."""
    grouped: dict[str, JSON] = {}
    for ds in results:
        uid = str(ds.SeriesInstanceUID)
        entry = grouped.setdefault(
            uid,
            {
                "uid": uid,
                "number": int(ds.SeriesNumber),
                "modality": {"system": DCM, "code": str(ds.Modality)},
                "description": str(ds.get("SeriesDescription", "")) or None,
                "instance": [],
            },
        )
        entry["instance"].append(
            {
                "uid": str(ds.SOPInstanceUID),
                "sopClass": {"system": URI, "code": f"urn:oid:{ds.SOPClassUID}"},
                "number": int(ds.InstanceNumber),
            }
        )
    for entry in grouped.values():
        entry["numberOfInstances"] = len(entry["instance"])
        if entry["description"] is None:
            del entry["description"]
    return list(grouped.values())


# --- Observations -----------------------------------------------------------------------------
def _observation(
    report: Report,
    key: str,
    code: JSON,
    text: str,
    *,
    subject: Entry,
    study: Entry,
    device: Entry | None,
    body_site: CodedConcept | None,
) -> JSON:
    resource: JSON = {
        "resourceType": "Observation",
        "id": local_id(report, "observation", key),
        "identifier": [oid_identifier(common.report_uid(report, "fhir-observation", key))],
        "status": "final",
        "category": [{"coding": [{"system": OBS_CATEGORY, "code": "imaging"}]}],
        "code": {"coding": [code], "text": text},
        "subject": subject.ref,
        "issued": instant(report),
        "derivedFrom": [study.ref],
    }
    if report.study.study_date:
        resource["effectiveDateTime"] = report.study.study_date.isoformat()
    if body_site is not None:
        resource["bodySite"] = {"coding": [coding(body_site)], "text": body_site.meaning}
    if device is not None:
        resource["device"] = device.ref
    return resource


def quantity(value: float, unit: str) -> JSON:
    if not math.isfinite(value):
        raise ReportError(f"a measurement is not a finite number ({value}); cannot encode it")
    return {"value": round(float(value), 4), "unit": unit, "system": UCUM, "code": unit}


def organ_observation(
    report: Report, organ: OrganMeasurement, subject: Entry, study: Entry, device: Entry | None
) -> Entry:
    key = common.organ_key(organ.model, organ.label_value)
    obs = _observation(
        report, key, VOLUME, f"{organ.concept.meaning} volume",
        subject=subject, study=study, device=device, body_site=organ.concept,
    )  # fmt: skip
    _organ_value(obs, organ)
    return Entry(obs, _search(obs["identifier"][0]))


def _organ_value(obs: JSON, organ: OrganMeasurement) -> None:
    """The volume, as far as the scan shows it.

    Complete: the value. Partial (the organ reaches an edge of the volume): the value
    with comparator ``>=`` — a lower bound — and a note saying which edge. Not found:
    no value but ``dataAbsentReason`` ``not-performed`` (the organ was not assessed) and
    a note; the status stays ``final`` (this record is complete: it says "no value")."""
    note = coverage_note(organ)
    if note is not None:
        obs["note"] = [{"text": note}]
    if organ.volume_ml is None:
        obs["dataAbsentReason"] = {
            "coding": [
                {"system": DATA_ABSENT, "code": "not-performed", "display": "Not Performed"}
            ],
            "text": "not assessed: not found in the scanned volume",
        }
        return
    obs["valueQuantity"] = quantity(organ.volume_ml, "mL")
    if organ.coverage == "partial":
        obs["valueQuantity"] = {"comparator": ">=", **obs["valueQuantity"]}


def finding_observations(
    report: Report,
    finding: Finding,
    organ: CodedConcept | None,
    subject: Entry,
    study: Entry,
    device: Entry | None,
) -> list[Entry]:
    """A lesion as a grouping Observation with one member Observation per measurement.

    A finding cut by the edge of the volume (``coverage`` partial), like a partial
    organ: each value has comparator ``>=`` (a lower bound) and every Observation a
    note saying which edge."""
    key = common.finding_key(finding.finding_id)
    name = common.lesion_name(finding.finding_id)
    note = finding_coverage_note(finding, name)
    members = []
    for part, code, value, unit in (
        ("long-axis", LONG_AXIS, finding.longest_diameter_mm, "mm"),
        ("short-axis", SHORT_AXIS, finding.short_axis_mm, "mm"),
        ("volume", VOLUME, finding.volume_ml, "mL"),
    ):
        obs = _observation(
            report, f"{key}:{part}", code, f"{name} {code['display'].lower()}",
            subject=subject, study=study, device=device, body_site=organ,
        )  # fmt: skip
        obs["valueQuantity"] = quantity(value, unit)
        if note is not None:
            obs["valueQuantity"] = {"comparator": ">=", **obs["valueQuantity"]}
            obs["note"] = [{"text": note}]
        members.append(Entry(obs, _search(obs["identifier"][0])))
    group = _observation(
        report, key, coding(finding.concept), f"{name}: {finding.concept.meaning}",
        subject=subject, study=study, device=device, body_site=organ,
    )  # fmt: skip
    tracking = common.tracking_uid(report, key)
    group["identifier"].append(oid_identifier(tracking, type={"text": "DICOM Tracking UID"}))
    group["hasMember"] = [m.ref for m in members]
    if note is not None:
        group["note"] = [{"text": note}]
    return [Entry(group, _search(group["identifier"][0])), *members]


def classification_observation(
    report: Report,
    classification: Classification,
    subject: Entry,
    study: Entry,
    device: Entry | None,
) -> Entry:
    """A positive classification: the class as the Observation's code, its aggregated
    probability (UCUM ``1``) as the value, and how it was aggregated as the method."""
    key = common.classification_key(classification.step)
    concept = classification.concept
    obs = _observation(
        report, key, coding(concept), f"{classification.step}: {concept.meaning}",
        subject=subject, study=study, device=device, body_site=None,
    )  # fmt: skip
    obs["valueQuantity"] = quantity(classification.probability, "1")
    obs["method"] = {
        "text": f"AI classification: {classification.aggregate} of the class probability "
        f"over {classification.slices} slices"
    }
    tracking = common.tracking_uid(report, key)
    obs["identifier"].append(oid_identifier(tracking, type={"text": "DICOM Tracking UID"}))
    return Entry(obs, _search(obs["identifier"][0]))


# --- DiagnosticReport -------------------------------------------------------------------------
def diagnostic_report_uid(report: Report) -> str:
    """The DiagnosticReport's identifier. With a lineage it names the AI report of this
    study by this pipeline (in its lineage's scope: ``Lineage.report_uid``), the same for
    every generation, so a re-run amends it; without one (no study UID: a NIfTI upload)
    it is this report's own."""
    study = report.study.study_instance_uid
    if report.lineage is None or not study:
        return common.report_uid(report, "fhir-diagnostic-report")
    if report.lineage.report_uid is not None:
        return report.lineage.report_uid
    return str(generate_uid(entropy_srcs=[study, report.pipeline.name, "fhir-diagnostic-report"]))


def diagnostic_report_status(report: Report) -> str:
    """``final`` for a first result, ``amended`` for a re-run that supersedes it."""
    return "amended" if common.generation(report) > 1 else "final"


def diagnostic_report_entry(
    report: Report,
    subject: Entry,
    study: Entry,
    results: Sequence[Entry],
    summary: str,
    report_json: str | None,
) -> Entry:
    identifier = oid_identifier(diagnostic_report_uid(report))
    forms = [_attachment("text/plain", summary, "radserve AI result summary")]
    if report_json is not None:
        forms.append(_attachment("application/json", report_json, "radserve report.json"))
    resource: JSON = {
        "resourceType": "DiagnosticReport",
        "id": local_id(report, "diagnostic-report"),
        "identifier": [identifier],
        "status": diagnostic_report_status(report),
        "category": [{"coding": [{"system": V2_0074, "code": "RAD", "display": "Radiology"}]}],
        "code": {"coding": [REPORT_CODE], "text": "AI imaging result"},
        "subject": subject.ref,
        "issued": instant(report),
        "imagingStudy": [study.ref],
        "conclusion": summary,
        "presentedForm": forms,
    }
    if report.study.study_date:
        resource["effectiveDateTime"] = report.study.study_date.isoformat()
    if results:
        resource["result"] = [r.ref for r in results]
    concepts = [f.concept for f in report.findings]
    concepts += [c.concept for c in report.classifications if c.positive]
    codes = {(c.scheme, c.value): c for c in concepts}
    if codes:
        resource["conclusionCode"] = [{"coding": [coding(c)]} for c in codes.values()]
    return Entry(resource, _search(identifier), update=common.generation(report) > 1)


def _attachment(content_type: str, text: str, title: str) -> JSON:
    return {
        "contentType": f"{content_type}; charset=utf-8",
        "language": "en",
        "data": base64.b64encode(text.encode("utf-8")).decode("ascii"),
        "title": title,
    }


# --- helpers ----------------------------------------------------------------------------------
