"""FHIR bundle: validates with fhir.resources R4B, round-trips, says what the report says,
and radserve's own checks catch what fhir.resources lets through."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pydicom
import pytest
from tests.factories.results import lesion_study

from radserve.errors import ReportError
from radserve.ingest import PatientInfo
from radserve.report.dicom import common, write_dicom_results
from radserve.report.json_report import parse_report
from radserve.report.schema import Report, ReportWarning

pytest.importorskip("fhir.resources")
from fhir.resources.R4B.bundle import Bundle

from radserve.report.fhir import build_fhir_bundle, check_bundle, validate_bundle
from radserve.report.fhir.patient import IdentifierSystems

PATIENT = PatientInfo(
    patient_name="Müller^Jürgen^^Dr.",
    patient_id="PID-0001",
    patient_birth_date="19700101",
    patient_sex="M",
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, list[pydicom.Dataset]]:
    study = lesion_study(tmp_path_factory.mktemp("fhir"))
    paths = write_dicom_results(study.report, study.out, study.files)
    return study.report, [pydicom.dcmread(p, stop_before_pixels=True) for p in paths]


def _resources(bundle: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == kind]


def _by_url(bundle: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["fullUrl"]: e["resource"] for e in bundle["entry"]}


def test_bundle_validates_and_round_trips(written) -> None:
    report, results = written
    bundle = build_fhir_bundle(report, PATIENT, dicom_results=results)
    text = json.dumps(bundle)  # JSON-ready
    parsed = Bundle.model_validate_json(text)
    assert json.loads(parsed.model_dump_json(exclude_none=True)) == bundle
    assert check_bundle(bundle) == []
    assert build_fhir_bundle(report, PATIENT, dicom_results=results) == bundle  # deterministic


def test_bundle_says_what_the_report_says(written) -> None:
    report, results = written
    bundle = build_fhir_bundle(
        report,
        PATIENT,
        dicom_results=results,
        identifier_systems=IdentifierSystems(default="urn:oid:1.2.3.4"),
    )
    urls = _by_url(bundle)
    (patient,) = _resources(bundle, "Patient")
    (identifier,) = patient["identifier"]
    assert (identifier["system"], identifier["value"]) == ("urn:oid:1.2.3.4", "PID-0001")
    assert identifier["type"]["coding"][0]["code"] == "MR"
    assert patient["name"][0]["family"] == "Müller" and patient["name"][0]["given"] == ["Jürgen"]
    assert (patient["gender"], patient["birthDate"]) == ("male", "1970-01-01")

    (study,) = _resources(bundle, "ImagingStudy")
    assert study["identifier"][0]["value"] == f"urn:oid:{report.study.study_instance_uid}"
    series = {s["uid"]: s for s in study["series"]}
    assert series[report.study.series_instance_uid]["modality"]["code"] == "CT"
    assert {s["modality"]["code"] for s in study["series"]} == {"CT", "SEG", "SR"}
    assert study["numberOfInstances"] == len(report.geometry.source_sop_instance_uids) + 3

    (diagnostic,) = _resources(bundle, "DiagnosticReport")
    assert diagnostic["status"] == "final"
    assert diagnostic["category"][0]["coding"][0]["code"] == "RAD"
    assert diagnostic["code"]["coding"][0] == {
        "system": "http://loinc.org",
        "code": "18748-4",
        "display": "Diagnostic imaging study",
    }
    assert "2 lesions detected" in diagnostic["conclusion"]
    assert [c["coding"][0]["code"] for c in diagnostic["conclusionCode"]] == ["52988006"]
    forms = {f["contentType"]: f for f in diagnostic["presentedForm"]}
    attached = base64.b64decode(forms["application/json; charset=utf-8"]["data"]).decode()
    assert parse_report(attached) == report
    assert "Müller" not in attached and "PID-0001" not in attached  # the JSON is de-identified

    results_of_report = [urls[r["reference"]] for r in diagnostic["result"]]
    organ, *lesions = results_of_report
    # The liver block of lesion_study runs past the first and last slice: a lower bound.
    assert report.organ_measurements[0].coverage == "partial"
    assert organ["valueQuantity"] == {
        "comparator": ">=",
        "value": round(report.organ_measurements[0].volume_ml, 4),
        "unit": "mL",
        "system": "http://unitsofmeasure.org",
        "code": "mL",
    }
    assert organ["bodySite"]["coding"][0]["code"] == "10200004"
    for finding, group in zip(report.findings, lesions, strict=True):
        assert group["code"]["coding"][0]["code"] == finding.concept.value
        assert group["bodySite"]["coding"][0]["code"] == "10200004"  # containing organ
        tracking = common.tracking_uid(report, common.finding_key(finding.finding_id))
        assert {"system": "urn:dicom:uid", "value": f"urn:oid:{tracking}"}.items() <= (
            group["identifier"][1].items()
        )
        members = {
            urls[m["reference"]]["code"]["coding"][0]["code"]: urls[m["reference"]]["valueQuantity"]
            for m in group["hasMember"]
        }
        assert members["103339001"]["value"] == pytest.approx(finding.longest_diameter_mm, 1e-4)
        assert members["103340004"]["value"] == pytest.approx(finding.short_axis_mm, 1e-4)
        assert members["118565006"] == {
            "value": round(finding.volume_ml, 4),
            "unit": "mL",
            "system": "http://unitsofmeasure.org",
            "code": "mL",
        }
    for obs in _resources(bundle, "Observation"):
        assert obs["subject"] == {"reference": bundle["entry"][0]["fullUrl"]}
        assert obs["derivedFrom"] == [{"reference": f"urn:uuid:{study['id']}"}]
        assert urls[obs["device"]["reference"]]["resourceType"] == "Device"
    assert len(_resources(bundle, "Observation")) == 1 + 4 * len(report.findings)


def test_transaction_is_idempotent_and_collection_has_no_requests(written) -> None:
    report, _ = written
    systems = IdentifierSystems(default="https://hospital.example/mrn")
    transaction = build_fhir_bundle(report, PATIENT, identifier_systems=systems)
    for entry in transaction["entry"]:
        assert entry["request"]["method"] == "POST"
        assert entry["request"]["ifNoneExist"].startswith("identifier=")
    # Without a system the Patient is never matched by its bare ID (issue 11, 5).
    first = build_fhir_bundle(report, PATIENT)["entry"][0]
    assert first["resource"]["resourceType"] == "Patient"
    assert "ifNoneExist" not in first["request"]
    collection = build_fhir_bundle(report, PATIENT, bundle_type="collection")
    assert collection["type"] == "collection"
    assert all("request" not in e for e in collection["entry"])


def test_unicode_name_and_awkward_patient_id(written) -> None:
    report, _ = written
    patient = PatientInfo(patient_name="Wang^XiaoMing=王^小明", patient_id="A 1&2", patient_sex="")
    bundle = build_fhir_bundle(
        report, patient, identifier_systems=IdentifierSystems(default="urn:oid:1.2.3")
    )
    (resource,) = _resources(bundle, "Patient")
    assert [n.get("family") for n in resource["name"]] == ["Wang", "王"]
    assert resource["gender"] == "unknown" and "birthDate" not in resource
    assert bundle["entry"][0]["request"]["ifNoneExist"] == "identifier=urn:oid:1.2.3|A%201%262"


def test_no_findings_report(written) -> None:
    report, _ = written
    empty = report.model_copy(update={"findings": [], "finding_axes": []})
    bundle = build_fhir_bundle(empty, PATIENT)
    (diagnostic,) = _resources(bundle, "DiagnosticReport")
    assert diagnostic["conclusion"].startswith("No lesions detected.")
    assert "not a negative result" not in diagnostic["conclusion"]
    assert "conclusionCode" not in diagnostic


def test_no_findings_outside_the_input_domain_is_no_negative_result(written) -> None:
    report, _ = written
    warning = ReportWarning(
        stage="ingest",
        code="outside_input_domain",
        message="no body in view: nothing above -500 HU",
    )
    empty = report.model_copy(update={"findings": [], "finding_axes": [], "warnings": [warning]})
    bundle = build_fhir_bundle(empty, PATIENT)
    (diagnostic,) = _resources(bundle, "DiagnosticReport")
    first, *rest = diagnostic["conclusion"].splitlines()
    assert first.startswith("No lesions detected, but") and "not a negative result" in first
    assert "Note: No body in view: nothing above -500 HU." in rest


def _corrupt(bundle: dict[str, Any], kind: str, **changes: Any) -> dict[str, Any]:
    bad = copy.deepcopy(bundle)
    next(e["resource"] for e in bad["entry"] if e["resource"]["resourceType"] == kind).update(
        changes
    )
    return bad


@pytest.mark.parametrize(
    ("kind", "changes", "message"),
    [
        ("Observation", {"status": "bogus"}, "status must be one of"),
        ("DiagnosticReport", {"status": "done"}, "status must be one of"),
        ("ImagingStudy", {"status": "final"}, "status must be one of"),
        ("Patient", {"gender": "m"}, "gender must be one of"),
        ("Observation", {"subject": {"reference": "urn:uuid:nowhere"}}, "not in the bundle"),
        ("Observation", {"code": {"coding": [{"code": "x"}]}}, "coding needs system and code"),
        (
            "Observation",
            {"valueQuantity": {"value": 1.0, "unit": "mL", "system": "http://unitsofmeasure.org"}},
            "UCUM quantity needs a code",
        ),
    ],
)
def test_own_checks_catch_what_fhir_resources_lets_through(
    written, kind: str, changes: dict[str, Any], message: str
) -> None:
    report, _ = written
    bad = _corrupt(build_fhir_bundle(report, PATIENT), kind, **changes)
    Bundle.model_validate(bad)  # fhir.resources accepts all of these
    assert any(message in p for p in check_bundle(bad))
    with pytest.raises(ReportError, match=message):
        validate_bundle(bad)


def test_schema_errors_never_quote_patient_data(written) -> None:
    report, _ = written
    bad = _corrupt(build_fhir_bundle(report, PATIENT), "Patient", birthDate="Müller-Jürgen")
    with pytest.raises(ReportError, match="does not validate against R4B") as info:
        validate_bundle(bad)
    assert "Müller" not in str(info.value)


def test_unknown_coding_scheme_is_a_clear_error(written) -> None:
    report, _ = written
    finding = report.findings[0]
    odd = finding.model_copy(update={"concept": finding.concept.model_copy(update={"scheme": "X"})})
    with pytest.raises(ReportError, match="coding scheme 'X'"):
        build_fhir_bundle(report.model_copy(update={"findings": [odd]}), PATIENT)


def test_fhir_module_is_r4b() -> None:
    assert Bundle.__module__.startswith("fhir.resources.R4B.")
