"""Ingest builds one PatientInfo per patient of a discovery, not one per instance, and
converts a value every instance repeats once: what it gives must be what a read of each
instance alone gives, whatever differs."""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.tag import Tag
from pydicom.uid import ExplicitVRBigEndian, ImplicitVRLittleEndian
from tests.factories.dicom_series import make_ct_series

from radserve.ingest import headers
from radserve.ingest.headers import DiscoveryMemo, InstanceRecord, PatientInfo, read_instance
from radserve.ingest.sources import SourceFile, SourceReader


def _edit(path: Path, **values: object) -> None:
    ds = pydicom.dcmread(path)
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    ds.save_as(path, enforce_file_format=True)


def _patients(paths: list[Path], memo: DiscoveryMemo | None) -> list[PatientInfo]:
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

    shared = _patients(paths, DiscoveryMemo())
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

    shared = _patients(paths, DiscoveryMemo())

    assert shared == _patients(paths, None)
    assert shared[0].patient_name == "Müller^Jörg"
    assert shared[1].patient_name == "MÃ¼ller^JÃ¶rg"  # the bytes as Latin-1, as guessed


def _records(paths: list[Path], memo: DiscoveryMemo | None) -> list[InstanceRecord]:
    with SourceReader() as reader:
        return [read_instance(reader, SourceFile(p), None, memo) for p in paths]


def _save_as(path: Path, syntax: object) -> None:
    """Rewrite with another transfer syntax (the header: pixel bytes are left as they
    are, which a header read does not look at)."""
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = syntax
    little, implicit = syntax != ExplicitVRBigEndian, syntax == ImplicitVRLittleEndian
    pydicom.dcmwrite(path, ds, little_endian=little, implicit_vr=implicit, enforce_file_format=True)


@pytest.mark.parametrize("max_entries", [4096, 3], ids=["memo", "memo full after 3"])
def test_repeated_values_converted_once_read_as_each_instance_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_entries: int
) -> None:
    """The same bytes in another byte order, without an explicit VR, as another VR or as
    a value pydicom cannot convert: each read as it is alone."""
    monkeypatch.setattr(headers, "_MEMO_MAX_ENTRIES", max_entries)
    paths = make_ct_series(tmp_path, n_slices=8)
    _save_as(paths[1], ImplicitVRLittleEndian)  # no VR in the file: the dictionary's
    _save_as(paths[2], ExplicitVRBigEndian)  # Rows (16): bytes 00 10 ...
    _edit(paths[6], Rows=4096)  # ... as 4096 is, little endian
    _edit(paths[3], SliceThickness="2.50")  # then made a DS pydicom cannot read as a number
    data = paths[3].read_bytes()
    paths[3].write_bytes(
        data.replace(b"\x18\x00\x50\x00DS\x04\x002.50", b"\x18\x00\x50\x00DS\x04\x00abc ")
    )
    ds = pydicom.dcmread(paths[4])  # Rows' two bytes as another VR
    ds.add_new(0x00280010, "SS", ds.Rows)
    ds.save_as(paths[4], enforce_file_format=True)
    _edit(paths[5], PixelSpacing=[0.5, 0.5], Rows=ds.Columns, Columns=ds.Rows)

    memo = DiscoveryMemo()
    shared = _records(paths, memo)

    assert shared == _records(paths, None)
    rows = {p: r.frames[0].pixel.rows for p, r in zip(paths, shared, strict=True)}
    assert sorted(set(rows.values())) == [12, 16, 4096]  # as written
    assert shared[3].frames[0].slice_thickness is None
    assert shared[0].frames[0].slice_thickness is not None
    assert 0 < len(memo.values) <= max_entries
    kept = {(key[0], key[1]) for key in memo.values}
    if max_entries > 3:  # Rows read little endian as US, the first instance's, is kept
        assert (Tag("Rows"), "US") in kept
