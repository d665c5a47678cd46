"""Priority classes from the request or from DICOM attributes; scheduler configuration."""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from pydantic import ValidationError
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from radserve.scheduling import (
    JobRequest,
    PriorityClass,
    PriorityRule,
    PriorityRules,
    Scheduler,
    SchedulerConfig,
    priority_attributes,
    read_priority_attributes,
)
from radserve.scheduling.fakes import FakeSession, fake_work

URG, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"RequestedProcedurePriority": "STAT"}, URG),
        ({"RequestedProcedurePriority": " high "}, URG),
        ({"RequestedProcedurePriority": "ROUTINE"}, OUT),
        ({"CurrentPatientLocation": "Emergency Department"}, URG),
        ({"CurrentPatientLocation": "ED bay 4"}, URG),
        ({"CurrentPatientLocation": "Ward 7B"}, INP),
        ({"CurrentPatientLocation": "ICU"}, INP),
        ({"AdmissionID": "A123"}, INP),
        ({"CurrentPatientLocation": "Fedora clinic"}, OUT),  # "ED" inside a word is no match
        ({}, OUT),
    ],
)
def test_default_rules(attributes: dict[str, str], expected: PriorityClass) -> None:
    assert PriorityRules().classify(attributes) is expected


def test_first_matching_rule_wins_and_default_is_configurable() -> None:
    rules = PriorityRules(
        rules=(
            PriorityRule(
                attribute="InstitutionalDepartmentName", equals=("Oncology",), priority="inpatient"
            ),
            PriorityRule(attribute="InstitutionalDepartmentName", matches="onc", priority="urgent"),
        ),
        default="inpatient",
    )
    assert rules.classify({"InstitutionalDepartmentName": "ONCOLOGY"}) is INP
    assert rules.classify({"InstitutionalDepartmentName": "paed-onc"}) is URG
    assert rules.classify({}) is INP
    assert rules.keywords == ("InstitutionalDepartmentName",)


def test_rule_errors_name_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match="not a DICOM keyword"):
        PriorityRule(attribute="PatientLocation", equals=("ED",), priority="urgent")
    with pytest.raises(ValidationError, match="exactly one of equals / matches / present"):
        PriorityRule(attribute="AdmissionID", equals=("x",), present=True, priority="urgent")
    with pytest.raises(ValueError, match="unknown priority class 'asap'"):
        PriorityClass.parse("asap")
    assert PriorityClass.parse("stat") is URG


def test_request_class_wins_over_rules() -> None:
    scheduler = Scheduler()
    work = fake_work(FakeSession(), 1)
    stat = {"RequestedProcedurePriority": "STAT"}
    assert scheduler.submit(JobRequest("a", work, attributes=stat)).cls is URG
    assert scheduler.submit(JobRequest("b", work, OUT, attributes=stat)).cls is OUT


def test_config_defaults_and_validation() -> None:
    config = SchedulerConfig(tat_s={"outpatient": 600}, queue_limits={"outpatient": 3})
    assert config.tat(OUT) == 600 and config.tat(INP) == 300 and config.tat(URG) == 60
    assert config.queue_limit(OUT) == 3 and config.queue_limit(URG) is None
    with pytest.raises(ValidationError, match="URGENT work is never refused"):
        SchedulerConfig(queue_limits={"urgent": 5})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SchedulerConfig(max_batchsize=8)  # type: ignore[call-arg]


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
    keywords = PriorityRules().keywords
    found = read_priority_attributes(tmp_path, keywords)
    assert found == {"RequestedProcedurePriority": "STAT", "CurrentPatientLocation": "Ward 3"}
    assert PriorityRules().classify(found) is URG
    assert read_priority_attributes(tmp_path / "notes.txt", keywords) == {}
    assert priority_attributes(Dataset(), keywords) == {}
