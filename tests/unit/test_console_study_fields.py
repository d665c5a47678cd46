"""The console's patient fields and accession come from the stored study, also when it
was uploaded as one zip: before session 35 only plain DICOM files were read, so every zip
upload showed empty patient fields and accession search could not find it."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pydicom
from tests.factories.service import make_study

from radserve.console.studyinfo import PatientFields, read_fields


def test_fields_are_read_from_plain_files_and_from_a_zip_alike(tmp_path: Path) -> None:
    files = make_study(
        tmp_path / "src",
        extra={"PatientName": "Zip^Patient", "PatientID": "ZIP-77", "AccessionNumber": "A-9"},
    )
    expected = pydicom.dcmread(files[0], stop_before_pixels=True)
    plain = read_fields(tmp_path / "src")
    stored = tmp_path / "stored"
    stored.mkdir()
    with zipfile.ZipFile(stored / "upload.zip", "w") as archive:
        for path in files:
            archive.write(path, f"study/{path.name}")
    zipped = read_fields(stored)
    assert zipped == plain
    assert (zipped.name, zipped.patient_id, zipped.accession) == (
        "Zip^Patient",
        "ZIP-77",
        "A-9",
    )
    assert zipped.birth_date == str(expected.get("PatientBirthDate", ""))
    (tmp_path / "nifti").mkdir()
    (tmp_path / "nifti" / "ct.nii.gz").write_bytes(b"\x1f\x8b not dicom")
    assert read_fields(tmp_path / "nifti") == PatientFields()
    assert read_fields(tmp_path / "missing") == PatientFields()
