"""Ingest builds one PatientInfo per patient of a discovery, not one per instance: what
it gives must be what a read of each instance alone gives, whatever differs."""

from __future__ import annotations

from pathlib import Path

import pydicom
from pydicom.dataset import Dataset
from tests.factories.dicom_series import make_ct_series

from radserve.ingest.headers import PatientInfo, PatientMemo, read_instance
from radserve.ingest.sources import SourceFile, SourceReader


def _edit(path: Path, **values: object) -> None:
    ds = pydicom.dcmread(path)
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    ds.save_as(path, enforce_file_format=True)


def _patients(paths: list[Path], memo: PatientMemo | None) -> list[PatientInfo]:
    with SourceReader() as reader:
        return [read_instance(reader, SourceFile(p), None, memo).patient for p in paths]


def test_one_patient_info_per_patient_equal_to_reading_each_alone(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path, n_slices=6)
    _edit(paths[2], PatientName="Müller^Jörg")  # another name in the same series
    # the same name, another character set: ISO_IR 100 bytes read as UTF-8 differ
    _edit(paths[3], SpecificCharacterSet="ISO_IR 192")
    request = Dataset()
    request.RequestedProcedurePriority = "STAT"
    _edit(paths[4], RequestAttributesSequence=[request])  # priority only in the sequence
    _edit(paths[5], PatientSex="F")

    shared = _patients(paths, PatientMemo())
    alone = _patients(paths, None)

    assert shared == alone
    assert shared[1] is shared[0]  # built once for the two identical headers
    assert len({id(p) for p in shared}) == 5
    assert shared[2].patient_name == "Müller^Jörg"
    assert shared[3].specific_character_set == ("ISO_IR 192",)
    assert shared[4].requested_procedure_priority == "STAT"
    assert shared[5].patient_sex == "F" and shared[0].patient_sex == "O"


def test_a_header_without_character_set_is_read_alone(tmp_path: Path) -> None:
    """Its name's character set is guessed from all of its text, not only the patient
    elements: two such headers with one name's bytes may read it differently."""
    paths = make_ct_series(tmp_path, n_slices=2)
    for path, description in zip(paths, (b"Thorax", b"Thorax \xdcbersicht"), strict=True):
        ds = pydicom.dcmread(path)
        del ds.SpecificCharacterSet
        ds.add_new(0x00100010, "PN", "Müller^Jörg".encode())  # UTF-8, undeclared
        ds.add_new(0x00081030, "LO", description)  # the second: Latin-1 text elsewhere
        ds.save_as(path, enforce_file_format=True)

    shared = _patients(paths, PatientMemo())

    assert shared == _patients(paths, None)
    assert shared[0].patient_name == "Müller^Jörg"
    assert shared[1].patient_name == "MÃ¼ller^JÃ¶rg"  # the bytes as Latin-1, as guessed
