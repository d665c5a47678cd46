"""A failure notice (the FHIR DiagnosticReport ``cancelled``, the DICOM failure SR) is
filed under the study's patient, study and order: it is sent only when every stored
instance names one patient (Patient ID and issuer, name, birth date, compared as ingest
compares them), one Study Instance UID and at most one Accession Number. Before, only
the first stored file was read: a study refused *because* its instances named two
patients ("... name 2 different patients") still had its notice filed under the first
file's patient. Its text carries no path: not the data dir's, not the sender's folder or
member names, not an unexpected exception's text."""

from __future__ import annotations

import datetime as dt
import zipfile
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pydicom
import pytest
from pydicom.dataset import Dataset
from tests.factories.dicom_series import make_ct_series, new_uid

from radserve.config import load_settings
from radserve.domain.jobs import JobState
from radserve.domain.priority import PriorityClass
from radserve.service.failure_notice import (
    INTERNAL_REASON,
    FailureNotices,
    identity_refusal,
    notice_reason,
)
from radserve.store import JobRecord

T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
OTHER = {"PatientID": "ZZPID999", "PatientName": "ZZOTHER^ZZ"}


def _header(**values: str) -> Dataset:
    ds = Dataset()
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.PatientName = "ZZTESTNAME^ZZ"
    ds.PatientID = "ZZPID123"
    ds.IssuerOfPatientID = "HOSP"
    ds.PatientBirthDate = "19010203"
    ds.AccessionNumber = "ZZACC777"
    ds.StudyInstanceUID = "1.2.3"
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    return ds


@pytest.mark.parametrize(
    ("second", "says"),
    [
        (OTHER, "different patients (they differ in Patient ID, Patient's Name)"),
        ({"PatientID": "ZZPID999"}, "differ in Patient ID"),
        ({"IssuerOfPatientID": "OTHER"}, "differ in Issuer of Patient ID"),
        ({"PatientBirthDate": "19020304"}, "differ in Patient's Birth Date"),
        ({"PatientID": ""}, "differ in Patient ID"),  # ingest: no ID is another patient
        ({"StudyInstanceUID": "1.2.4"}, "several studies"),
        ({"AccessionNumber": "ZZACC778"}, "different Accession Numbers"),
    ],
)
def test_instances_that_disagree_address_no_notice(second: dict[str, str], says: str) -> None:
    refused = identity_refusal([_header(), _header(), _header(**second)])
    assert refused is not None and says in refused, refused
    for value in ("ZZTESTNAME", "ZZPID", "19010203", "ZZACC", "HOSP", "1.2.3"):
        assert value not in refused  # the attributes named, never their values


@pytest.mark.parametrize(
    "second",
    [
        {},
        {"PatientName": "ZZTESTNAME^ZZ^^"},  # trailing empty components: one name to ingest
        {"AccessionNumber": ""},  # an instance without one agrees with any
        {"StudyInstanceUID": ""},
    ],
)
def test_instances_that_agree_address_a_notice(second: dict[str, str]) -> None:
    assert identity_refusal([_header(), _header(**second)]) is None


def test_the_first_instance_is_checked_as_ingest_checks_it() -> None:
    refused = identity_refusal([_header(PatientID="A\\B")])
    assert refused is not None and "Patient ID holds 2 values" in refused


def test_the_reason_carries_no_path_and_no_exception_text(tmp_path: Path) -> None:
    data = tmp_path / "dätä dir ü"
    study = data / "studies" / "0a" / "3f9c.zip"
    failed = _job(study, "attribute_invalid", f"{study}!x: the Modality contradicts")
    assert (
        notice_reason(failed, data) == "<data dir>/studies/0a/3f9c.zip!x: the Modality contradicts"
    )
    crashed = _job(study, "internal_error", f"unexpected BadZipFile: Bad CRC-32 for '{study}!ZZ/1'")
    assert notice_reason(crashed, data) == INTERNAL_REASON


# --- through FailureNotices, FHIR and SR, on studies stored as the doors store them -----------
def _study(folder: Path, *, other_from: int | None = None, every_other: bool = False) -> Path:
    """A stored CT study in ``folder/stored``: instances from ``other_from`` on, or every
    other one, name another patient; as a zip under a folder naming the patient."""
    source = make_ct_series(
        folder / "src",
        n_slices=6,
        study_uid=new_uid(),
        extra={"PatientID": "ZZPID123", "PatientName": "ZZTESTNAME^ZZ"},
    )
    for n, path in enumerate(source):
        if (every_other and n % 2) or (other_from is not None and n >= other_from):
            ds = pydicom.dcmread(path)
            for keyword, value in OTHER.items():
                setattr(ds, keyword, value)
            ds.save_as(path, enforce_file_format=True)
    stored = folder / "stored"
    stored.mkdir()
    with zipfile.ZipFile(stored / "3f9c.zip", "w") as zf:
        for path in source:
            zf.write(path, f"ZZTESTNAME^ZZ ZZPID123 19010203/CT/{path.name}")
    return stored


def _job(study: Path, code: str = "attribute_invalid", message: str = "refused") -> JobRecord:
    return JobRecord(
        "job-1",
        JobState.FAILED,
        PriorityClass.OUTPATIENT,
        T0,
        T0,
        "ct",
        "1",
        "fp32",
        "f",
        str(study),
        error_code=code,
        error_message=message,
    )


def _notices(tmp_path: Path) -> tuple[FailureNotices, MagicMock, MagicMock, list[Any]]:
    settings = load_settings(None, data_dir=str(tmp_path / "data"))
    metrics, gateway, fhir = MagicMock(), MagicMock(), MagicMock()
    gateway.wants_dicom_results.return_value = True
    bundles: list[Any] = []
    fhir.outbox.enqueue.side_effect = lambda bundle, **_: bundles.append(bundle)
    notices = FailureNotices(
        settings, metrics=metrics, fhir=fhir, results_root=tmp_path / "results", gateway=gateway
    )
    return notices, metrics, gateway, bundles


@pytest.mark.parametrize(
    "mixed", [{"every_other": True}, {"other_from": 3}], ids=["every-other", "second-half"]
)
def test_a_study_naming_two_patients_gets_no_notice_on_either_channel(
    tmp_path: Path, mixed: dict[str, Any]
) -> None:
    notices, metrics, gateway, bundles = _notices(tmp_path)
    notices.on_failed(_job(_study(tmp_path, **mixed)))
    assert bundles == []
    gateway.send.assert_not_called()
    metrics.errors.labels.assert_called_once_with("failure_notice_unaddressable")
    assert not (tmp_path / "results").exists()  # no SR written either


def test_a_study_of_one_patient_gets_both_notices_without_paths(tmp_path: Path) -> None:
    notices, metrics, gateway, bundles = _notices(tmp_path)
    study = _study(tmp_path)
    member = f"{study / '3f9c.zip'}!ZZTESTNAME^ZZ ZZPID123 19010203/CT/ct1_0003.dcm"
    notices.on_failed(_job(study, "internal_error", f"unexpected OSError: {member}"))
    [bundle] = bundles
    [report] = [
        e["resource"]
        for e in bundle["entry"]
        if e["resource"]["resourceType"] == "DiagnosticReport"
    ]
    assert INTERNAL_REASON in report["conclusion"]
    [(path,), _] = gateway.send.call_args
    sr = pydicom.dcmread(path)
    assert sr.PatientID == "ZZPID123"
    text = str(report["conclusion"]) + str(sr)
    for planted in ("ZZTESTNAME^ZZ ZZPID123", "19010203", "3f9c", str(tmp_path)):
        assert planted not in text
    metrics.errors.labels.assert_not_called()
