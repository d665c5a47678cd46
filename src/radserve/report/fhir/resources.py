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
from typing import Any, Protocol
from urllib.parse import quote

from radserve.domain import CodedConcept, Finding, OrganMeasurement
from radserve.errors import ReportError
from radserve.report.dicom import common
from radserve.report.schema import Report

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
SYSTEMS = {"SCT": SNOMED, "SRT": SNOMED, "LN": LOINC, "DCM": DCM, "UCUM": UCUM}

REPORT_CODE = {"system": LOINC, "code": "18748-4", "display": "Diagnostic imaging study"}
VOLUME = {"system": SNOMED, "code": "118565006", "display": "Volume"}
LONG_AXIS = {"system": SNOMED, "code": "103339001", "display": "Long axis"}
SHORT_AXIS = {"system": SNOMED, "code": "103340004", "display": "Short axis"}
_GENDER = {"M": "male", "F": "female", "O": "other"}


class PatientLike(Protocol):
    """What the writers need of :class:`radserve.ingest.PatientInfo`."""

    patient_name: str
    patient_id: str
    patient_birth_date: str
    patient_sex: str


@dataclass(frozen=True)
class Entry:
    """A resource, its bundle-local URL and the search that finds an existing copy."""

    resource: JSON
    if_none_exist: str | None = None

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


def instant(report: Report) -> str:
    """``generated_at`` as a FHIR instant in UTC (the form fhir.resources writes back)."""
    return report.generated_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


# --- Patient, Device, ImagingStudy ------------------------------------------------------------
def patient_entry(report: Report, patient: PatientLike, system: str | None) -> Entry:
    resource: JSON = {"resourceType": "Patient", "id": local_id(report, "patient")}
    search = None
    if patient.patient_id:
        identifier: JSON = {"value": patient.patient_id}
        if system:
            identifier = {"system": system, **identifier}
        resource["identifier"] = [identifier]
        search = _search(identifier)
    names = [n for n in (_human_name(g) for g in patient.patient_name.split("=")) if n]
    if names:
        names[0]["use"] = "official"
        resource["name"] = names
    resource["gender"] = _GENDER.get(patient.patient_sex.strip().upper(), "unknown")
    if birth := _fhir_date(patient.patient_birth_date):
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
        "numberOfInstances": len(report.geometry.source_sop_instance_uids),
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
    obs["valueQuantity"] = quantity(organ.volume_ml, "mL")
    return Entry(obs, _search(obs["identifier"][0]))


def finding_observations(
    report: Report,
    finding: Finding,
    organ: CodedConcept | None,
    subject: Entry,
    study: Entry,
    device: Entry | None,
) -> list[Entry]:
    """A lesion as a grouping Observation with one member Observation per measurement."""
    key = common.finding_key(finding.finding_id)
    name = common.lesion_name(finding.finding_id)
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
        members.append(Entry(obs, _search(obs["identifier"][0])))
    group = _observation(
        report, key, coding(finding.concept), f"{name}: {finding.concept.meaning}",
        subject=subject, study=study, device=device, body_site=organ,
    )  # fmt: skip
    tracking = common.tracking_uid(report, key)
    group["identifier"].append(oid_identifier(tracking, type={"text": "DICOM Tracking UID"}))
    group["hasMember"] = [m.ref for m in members]
    return [Entry(group, _search(group["identifier"][0])), *members]


# --- DiagnosticReport -------------------------------------------------------------------------
def diagnostic_report_entry(
    report: Report,
    subject: Entry,
    study: Entry,
    results: Sequence[Entry],
    summary: str,
    report_json: str | None,
) -> Entry:
    identifier = oid_identifier(common.report_uid(report, "fhir-diagnostic-report"))
    forms = [_attachment("text/plain", summary, "radserve AI result summary")]
    if report_json is not None:
        forms.append(_attachment("application/json", report_json, "radserve report.json"))
    resource: JSON = {
        "resourceType": "DiagnosticReport",
        "id": local_id(report, "diagnostic-report"),
        "identifier": [identifier],
        "status": "final",
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
    codes = {(f.concept.scheme, f.concept.value): f.concept for f in report.findings}
    if codes:
        resource["conclusionCode"] = [{"coding": [coding(c)]} for c in codes.values()]
    return Entry(resource, _search(identifier))


def _attachment(content_type: str, text: str, title: str) -> JSON:
    return {
        "contentType": f"{content_type}; charset=utf-8",
        "language": "en",
        "data": base64.b64encode(text.encode("utf-8")).decode("ascii"),
        "title": title,
    }


# --- helpers ----------------------------------------------------------------------------------
def _human_name(group: str) -> JSON | None:
    """One DICOM PN component group (family^given^middle^prefix^suffix) as a HumanName."""
    parts = [p.strip() for p in group.split("^")] + [""] * 5
    family, given, middle, prefix, suffix = parts[:5]
    if not any((family, given, middle, prefix, suffix)):
        return None
    name: JSON = {"text": " ".join(p for p in (prefix, given, middle, family, suffix) if p)}
    if family:
        name["family"] = family
    if given_names := [g for g in (given, middle) if g]:
        name["given"] = given_names
    if prefix:
        name["prefix"] = [prefix]
    if suffix:
        name["suffix"] = [suffix]
    return name


def _fhir_date(value: str) -> str | None:
    """DICOM DA (YYYYMMDD) as a FHIR date; anything else is left out."""
    try:
        return dt.datetime.strptime(value.strip(), "%Y%m%d").date().isoformat()
    except ValueError:
        return None
