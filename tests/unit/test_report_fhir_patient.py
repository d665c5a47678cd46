"""FHIR Patient (issue 11, 5): an identifier system from the issuer (never guessed), and
names from ISO 2022 studies as clean HumanNames — one per representation, family and
given, text in the order the name is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.factories.results import lesion_study, relabel
from tests.unit.test_ingest_person_name import IR58, IR87, IR149

from radserve.config import Settings
from radserve.ingest import PatientInfo, discover_series
from radserve.report.fhir.patient import (
    REPRESENTATION,
    IdentifierSystems,
    human_names,
    patient_identifier,
)

pytest.importorskip("fhir.resources")
from radserve.report.fhir import build_fhir_bundle
from radserve.service.job_fhir import fhir_bundle_for

SYSTEMS = IdentifierSystems(
    default="https://hospital.example/mrn", by_issuer={"HOSP_B": "https://b.example/pid"}
)


@pytest.mark.parametrize(
    ("issuer", "universal", "kind", "system"),
    [
        ("", "", "", "https://hospital.example/mrn"),  # no issuer: the configured default
        ("HOSP_B", "", "", "https://b.example/pid"),  # mapped issuer
        ("1.2.840.113619.6.99", "", "", "urn:oid:1.2.840.113619.6.99"),  # OID issuer
        ("urn:oid:1.2.3", "", "", "urn:oid:1.2.3"),
        ("https://c.example/ids", "", "", "https://c.example/ids"),
        ("HOSP_C", "2.16.840.1.113883.19.5", "ISO", "urn:oid:2.16.840.1.113883.19.5"),
        ("HOSP_C", "B0A4C9A2-1E0B-4B6F-9C4E-7A1D2E3F4A5B", "UUID",
         "urn:uuid:b0a4c9a2-1e0b-4b6f-9c4e-7a1d2e3f4a5b"),
        ("HOSP_C", "", "", None),  # unknown issuer: another ID space, not the default
        ("HOSP_C", "not-an-oid", "ISO", None),
    ],
)  # fmt: skip
def test_identifier_system(issuer: str, universal: str, kind: str, system: str | None) -> None:
    patient = PatientInfo(
        patient_id="P-1",
        issuer_of_patient_id=issuer,
        issuer_universal_entity_id=universal,
        issuer_universal_entity_id_type=kind,
    )
    identifier = patient_identifier(patient, SYSTEMS)
    assert identifier is not None and identifier["value"] == "P-1"
    assert identifier.get("system") == system
    if system is None:
        assert identifier["assigner"] == {"display": issuer}


def test_no_system_without_issuer_or_setting() -> None:
    identifier = patient_identifier(PatientInfo(patient_id="P-1"), IdentifierSystems())
    assert identifier is not None and "system" not in identifier
    assert patient_identifier(PatientInfo(), SYSTEMS) is None


def test_settings_give_the_systems_and_refuse_relative_ones() -> None:
    settings = Settings.model_validate(
        {
            "fhir": {
                "patient_identifier_system": "urn:oid:1.2.3",
                "issuer_systems": {"HOSP_B": "https://b.example/pid"},
            }
        }
    )
    systems = IdentifierSystems.from_settings(settings.fhir)
    assert systems.default == "urn:oid:1.2.3"
    assert systems.by_issuer == {"HOSP_B": "https://b.example/pid"}
    for bad in ({"patient_identifier_system": "hospital a"}, {"issuer_systems": {"X": "mrn"}}):
        with pytest.raises(ValueError):
            Settings.model_validate({"fhir": bad})


def test_human_names_one_per_representation_in_written_order() -> None:
    names = human_names("Yamada^Tarou=山田^太郎=やまだ^たろう")
    assert [n["extension"] for n in names] == [
        [{"url": REPRESENTATION, "valueCode": code}] for code in ("ABC", "IDE", "SYL")
    ]
    assert [(n["family"], n["given"], n["text"]) for n in names] == [
        ("Yamada", ["Tarou"], "Tarou Yamada"),
        ("山田", ["太郎"], "山田 太郎"),
        ("やまだ", ["たろう"], "やまだ たろう"),
    ]
    assert all(n["use"] == "official" for n in names)
    # One group in East Asian script: family name first, no representation extension.
    (name,) = human_names("王^小明")
    assert (name["text"], "extension" in name) == ("王 小明", False)
    (name,) = human_names("Müller^Jürgen^^Dr.")
    assert name == {
        "use": "official",
        "text": "Dr. Jürgen Müller",
        "family": "Müller",
        "given": ["Jürgen"],
        "prefix": ["Dr."],
    }
    (name,) = human_names("=山田^太郎")  # ideographic only
    assert name["extension"][0]["valueCode"] == "IDE" and name["family"] == "山田"


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory):
    return lesion_study(tmp_path_factory.mktemp("fhir-patient"))


ISO_2022 = {
    "ir58": (IR58, ["", "ISO 2022 IR 58"], ["Zhang", "张", "zhang"]),
    "ir87": (IR87, ["", "ISO 2022 IR 87"], ["Yamada", "山田", "やまだ"]),
    "ir149": (IR149, ["", "ISO 2022 IR 149"], ["Hong", "洪", "홍"]),
}


def _strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


@pytest.mark.parametrize("case", sorted(ISO_2022))
def test_iso_2022_study_gives_a_clean_patient(study, tmp_path: Path, case: str) -> None:
    """Through the real path: DICOM files -> ingest's PatientInfo -> the served Bundle."""
    raw, charset, families = ISO_2022[case]
    folder = tmp_path / "study"
    relabel(study.files, folder, raw, charset=charset, IssuerOfPatientID="HOSP_B")
    (header,) = [h for h in discover_series(folder)]
    assert header.patient.issuer_of_patient_id == "HOSP_B"
    bundle = fhir_bundle_for(study.report, folder, study.out, SYSTEMS)
    assert not [s for s in _strings(bundle) if any(ord(c) < 0x20 and c != "\n" for c in s)]
    (patient,) = [e for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient"]
    resource = patient["resource"]
    assert [n["family"] for n in resource["name"]] == families
    assert [n["extension"][0]["valueCode"] for n in resource["name"]] == ["ABC", "IDE", "SYL"]
    assert resource["identifier"][0]["system"] == "https://b.example/pid"
    assert patient["request"]["ifNoneExist"].startswith("identifier=https://b.example/pid|")
    assert "\\u001b" not in json.dumps(bundle)


def test_unknown_issuer_is_not_conditionally_created(study) -> None:
    patient = PatientInfo(patient_id="P-1", issuer_of_patient_id="SOMEWHERE_ELSE")
    bundle = build_fhir_bundle(study.report, patient, identifier_systems=SYSTEMS)
    entry = bundle["entry"][0]
    assert entry["resource"]["resourceType"] == "Patient"
    assert "system" not in entry["resource"]["identifier"][0]
    assert "ifNoneExist" not in entry["request"]


def test_the_run_s_own_patient_stands_for_re_reading_the_study(tmp_path: Path) -> None:
    """The FHIR deliveries right after a run (the critical push's Bundle, the job's
    Bundle) take the patient the run's ingest read instead of parsing every header of
    the stored study again; it is the same patient the re-read gives, and with the
    study's files gone only the run's own patient is there to give."""
    from tests.factories.dicom_series import make_ct_series
    from tests.factories.results import LESION_GRID, LESION_SLICES, lesions_hu, run_test_pipeline

    from radserve.errors import NotDicomError
    from radserve.service.job_fhir import patient_for, report_resources_for

    make_ct_series(
        tmp_path / "study",
        n_slices=LESION_SLICES,
        hu=lesions_hu,
        **LESION_GRID,
        extra={"PatientName": "Doe^Jane", "PatientID": "P-77", "IssuerOfPatientID": "HOSP_B"},
    )
    result = run_test_pipeline(tmp_path)
    study = tmp_path / "study"
    assert result.patient is not None and result.patient.patient_id == "P-77"
    assert patient_for(result.report, study) == result.patient
    for path in study.glob("*.dcm"):
        path.unlink()
    with pytest.raises(NotDicomError):  # what a re-read would find now
        patient_for(result.report, study)
    resources = report_resources_for(
        result.report, study, result.out_dir, SYSTEMS, patient=result.patient
    )
    bundle = fhir_bundle_for(result.report, study, result.out_dir, SYSTEMS, patient=result.patient)
    for patient in (resources.subject, bundle["entry"][0]):
        text = json.dumps(patient, default=str)
        assert "P-77" in text and "Doe" in text
