"""The FHIR texts a clinician reads name a lesion's organ as the SR and SEG code it.

A lesion's containing organ is a model label (``lung_left``); the SR's finding site and
the SEG's anatomic region carry the organ's concept ("Left lung"), and the conclusion's
organ lines say "Left lung volume: ...". Until session 44 the DiagnosticReport
conclusion and a critical finding's Communication said "Nodule in lung_left", the
model's internal label, beside "Left lung volume" in the same conclusion.
"""

from __future__ import annotations

import datetime as dt

import pytest
from tests.factories.results import lesion_study

from radserve.domain import CodedConcept
from radserve.ingest import PatientInfo
from radserve.report.schema import Report

pytest.importorskip("fhir.resources")
from radserve.report.fhir import build_fhir_bundle
from radserve.report.fhir.bundle import ReportResources
from radserve.report.fhir.critical import critical_bundle

LEFT_LUNG = CodedConcept(value="44029006", scheme="SCT", meaning="Left lung")


def _in_left_lung(report: Report) -> Report:
    """``report`` with its organ relabelled as the reference pipeline names the left lung."""
    old = report.organ_measurements[0].label
    organs = [
        m.model_copy(update={"label": "lung_left", "concept": LEFT_LUNG}) if m.label == old else m
        for m in report.organ_measurements
    ]
    findings = [
        f.model_copy(update={"containing_organ": "lung_left"}) if f.containing_organ == old else f
        for f in report.findings
    ]
    assert any(f.containing_organ == "lung_left" for f in findings)
    return report.model_copy(update={"organ_measurements": organs, "findings": findings})


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _in_left_lung(lesion_study(tmp_path_factory.mktemp("wording")).report)


def _patient() -> PatientInfo:
    return PatientInfo(patient_name="Doe^Jane", patient_id="P1", issuer_of_patient_id="1.2.3")


def test_conclusion_names_a_lesions_organ_by_its_concept(report: Report) -> None:
    bundle = build_fhir_bundle(report, _patient())
    diagnostic = next(
        e["resource"]
        for e in bundle["entry"]
        if e["resource"]["resourceType"] == "DiagnosticReport"
    )
    conclusion = diagnostic["conclusion"]
    assert "Left lung volume" in conclusion  # the organ line, as before
    lesion_lines = [line for line in conclusion.splitlines() if line.startswith("- Lesion")]
    assert lesion_lines and all(" in left lung)" in line for line in lesion_lines), conclusion
    assert "lung_left" not in conclusion


def test_critical_communication_names_the_organ_by_its_concept(report: Report) -> None:
    finding = next(f for f in report.findings if f.containing_organ == "lung_left")
    resources = ReportResources(report, _patient())
    bundle = critical_bundle(
        resources,
        finding_id=finding.finding_id,
        notice_id="00000000-0000-4000-8000-000000000001",
        rule="long axis >= 5 mm",
        sent=dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC),
    )
    communication = next(
        e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Communication"
    )
    text = communication["payload"][0]["contentString"]
    assert " in left lung)" in text and "lung_left" not in text, text
