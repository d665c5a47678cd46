"""Priority classes from the request or from DICOM attributes; scheduler configuration."""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from pydantic import ValidationError
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid
from tests.factories.scheduling_fakes import FakeSession, fake_work

from radserve.config import SchedulerSettings
from radserve.ingest.attributes import priority_attributes, read_priority_attributes
from radserve.scheduling import (
    JobRequest,
    PriorityClass,
    PriorityRule,
    PriorityRules,
    Scheduler,
)

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT


# The scheduler's former built-in rules, now an example of site rules in the README.
SITE_RULES = PriorityRules(
    (
        PriorityRule(
            attribute="RequestedProcedurePriority", values=("STAT", "HIGH"), **{"class": "urgent"}
        ),
        PriorityRule(
            attribute="CurrentPatientLocation",
            matches=r"\b(ED|ER|A&E|EMERG\w*|TRAUMA|RESUS\w*)\b",
            priority_class=URG,
        ),
        PriorityRule(
            attribute="CurrentPatientLocation",
            matches=r"\b(ICU|ITU|CCU|WARD|INPATIENT|IP)\b",
            priority_class=INP,
        ),
        PriorityRule(attribute="AdmissionID", present=True, priority_class=INP),
    )
)


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"RequestedProcedurePriority": "STAT"}, URG),
        ({"RequestedProcedurePriority": " stat "}, URG),
        ({"RequestedProcedurePriority": "HIGH"}, INP),
        ({"RequestedProcedurePriority": "ROUTINE"}, OUT),
        ({"CurrentPatientLocation": "ED bay 4"}, OUT),  # no location rule by default
        ({}, OUT),
    ],
)
def test_default_rules(attributes: dict[str, str], expected: PriorityClass) -> None:
    """One default rule set (the settings' and the scheduler's): STAT -> URGENT, HIGH ->
    INPATIENT, anything else OUTPATIENT."""
    assert PriorityRules().classify(attributes) is expected
    assert Scheduler().rules.classify(attributes) is expected


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"RequestedProcedurePriority": " high "}, URG),
        ({"CurrentPatientLocation": "Emergency Department"}, URG),
        ({"CurrentPatientLocation": "ED bay 4"}, URG),
        ({"CurrentPatientLocation": "Ward 7B"}, INP),
        ({"CurrentPatientLocation": "ICU"}, INP),
        ({"AdmissionID": "A123"}, INP),
        ({"CurrentPatientLocation": "Fedora clinic"}, OUT),  # "ED" inside a word is no match
        ({}, OUT),
    ],
)
def test_site_rules_with_every_matcher(attributes: dict[str, str], expected: PriorityClass) -> None:
    assert SITE_RULES.classify(attributes) is expected


def test_first_matching_rule_wins() -> None:
    rules = PriorityRules(
        (
            PriorityRule(
                attribute="InstitutionalDepartmentName", values=("Oncology",), priority_class=INP
            ),
            PriorityRule(
                attribute="InstitutionalDepartmentName", matches="onc", priority_class="urgent"
            ),
        )
    )
    assert rules.classify({"InstitutionalDepartmentName": "ONCOLOGY"}) is INP
    assert rules.classify({"InstitutionalDepartmentName": "paed-onc"}) is URG
    assert rules.classify({}) is OUT
    assert rules.keywords == ("InstitutionalDepartmentName",)


def test_rule_errors_name_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match="not a DICOM keyword"):
        PriorityRule(attribute="PatientLocation", values=("ED",), priority_class=URG)
    with pytest.raises(ValidationError, match="did you mean 'CurrentPatientLocation'"):
        PriorityRule(attribute="CurrentPatientLocaton", values=("ED",), priority_class=URG)
    with pytest.raises(ValidationError, match="exactly one of values / matches / present"):
        PriorityRule(attribute="AdmissionID", values=("x",), present=True, priority_class=URG)
    with pytest.raises(ValidationError, match="not a regular expression"):
        PriorityRule(attribute="AdmissionID", matches="(", priority_class=URG)
    with pytest.raises(ValueError, match="unknown priority class 'asap'") as refused:
        PriorityClass.parse("asap")
    assert "(or stat, which is urgent)" in str(refused.value)  # every name it takes
    assert PriorityClass.parse("stat") is URG


def test_one_class_type_for_api_database_and_scheduler() -> None:
    """The value is the stored/served string; ``rank`` orders; every member is truthy
    (so ``priority or default`` can never drop an URGENT request)."""
    assert [c.value for c in PriorityClass] == ["URGENT", "INPATIENT", "OUTPATIENT"]
    assert sorted(PriorityClass, key=lambda c: c.rank) == [URG, INP, OUT]
    assert all(bool(c) for c in PriorityClass)
    assert [c.promoted() for c in PriorityClass] == [URG, URG, INP]


def test_request_class_wins_over_rules() -> None:
    scheduler = Scheduler()
    work = fake_work(FakeSession(), 1)
    stat = {"RequestedProcedurePriority": "STAT"}
    assert scheduler.submit(JobRequest("a", work, attributes=stat)).cls is URG
    assert scheduler.submit(JobRequest("b", work, OUT, attributes=stat)).cls is OUT


def test_config_defaults_and_validation() -> None:
    config = SchedulerSettings(tat_s={"outpatient": 600}, queue_limits={"outpatient": 3})
    assert config.tat(OUT) == 600 and config.tat(INP) == 300 and config.tat(URG) == 60
    assert config.queue_limit(OUT) == 3 and config.queue_limit(URG) is None
    with pytest.raises(ValidationError, match="URGENT work is never refused"):
        SchedulerSettings(queue_limits={"urgent": 5})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SchedulerSettings(max_batchsize=8)  # type: ignore[call-arg]


def _write_dicom(path: Path, **attributes: object) -> Path:
    ds = Dataset()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    ds.SOPInstanceUID = generate_uid()
    for keyword, value in attributes.items():
        setattr(ds, keyword, value)
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    pydicom.dcmwrite(path, ds, enforce_file_format=True)
    return path


def test_attributes_read_from_a_study_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not dicom")
    request = Dataset()
    request.RequestedProcedurePriority = "STAT"
    _write_dicom(
        tmp_path / "x.dcm", CurrentPatientLocation="Ward 3", RequestAttributesSequence=[request]
    )
    keywords = SITE_RULES.keywords
    found = read_priority_attributes(tmp_path, keywords)
    assert found == {"RequestedProcedurePriority": "STAT", "CurrentPatientLocation": "Ward 3"}
    assert SITE_RULES.classify(found) is URG
    assert read_priority_attributes(tmp_path / "notes.txt", keywords) == {}
    assert priority_attributes(Dataset(), keywords) == {}


def test_the_default_rules_load_no_dicom_dictionary() -> None:
    """The default rules' keyword is known without pydicom's data dictionary, so an API
    reader or the audit writer (which import radserve.domain) do not load pydicom; it is
    one of the dictionary's keywords."""
    import subprocess
    import sys

    from pydicom.datadict import keyword_dict

    from radserve.domain.priority import DEFAULT_RULES

    assert {r.attribute for r in DEFAULT_RULES} == {"RequestedProcedurePriority"}
    assert "RequestedProcedurePriority" in keyword_dict
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, radserve.api.reader; print('pydicom' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert loaded == "False"
