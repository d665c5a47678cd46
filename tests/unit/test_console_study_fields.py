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


def test_several_values_read_as_dicom_writes_them(
    tmp_path: Path,
) -> None:
    """A study a PACS sent with two Accession Numbers and two names (refused at ingest:
    it names no one order) still shows on the worklist; before session 42 its fields were
    Python's list text, ``['AC8', 'AC8B']``, and ``GET /v1/jobs?accession=AC8%5CAC8B``
    (exactly the number as DICOM writes it) did not find it."""
    import io

    from radserve.ingest.stored import stored_accession
    from radserve.service.upload_key import upload_accession

    files = make_study(
        tmp_path / "src",
        extra={
            "PatientName": ["Müller^Jürgen", "Second^Value"],
            "SpecificCharacterSet": "ISO_IR 192",
            "PatientID": "PID8",
            "AccessionNumber": ["AC8", "AC8B"],
        },
    )
    fields = read_fields(tmp_path / "src")
    assert (fields.accession, fields.name) == ("AC8\\AC8B", "Müller^Jürgen\\Second^Value")
    assert stored_accession(tmp_path / "src") == "AC8\\AC8B"
    assert upload_accession([io.BytesIO(files[0].read_bytes())]) == "AC8\\AC8B"
