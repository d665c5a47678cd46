"""Files that look like DICOM but cannot be read are said in the loaded series' warnings
(counted, never named), and in the gap one leaves: a header cut after 300 bytes (a copy
that stopped), zip members zero-filled or empty (an archive never finished). Before
(session 43 trial "t-ingest"), their skip reasons matched none of the prefixes ingest
looked for ("DICOM without SOP Class/...", "not DICOM (no 'DICM' marker)"): `radserve run`
exited 0 on 35 of 40 slices without a word, and a cut slice in the middle failed as a
bare "missing slices". Skipped files now carry a kind (``SkipKind``), set where each is
skipped, and ingest reports every ``UNREADABLE`` one."""

from __future__ import annotations

import inspect
import io
import zipfile
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from tests.factories.dicom_series import make_ct_series

from radserve.errors import GeometryError
from radserve.ingest import discover_series, load_series
from radserve.ingest.headers import SkipFile
from radserve.ingest.sources import SkipKind, SkippedFile

SAID = "file(s) of the input were skipped, unreadable"
ANALYSED_WITHOUT = "if they were images of this series, it was analysed without them"


def _unreadable_warnings(warnings: tuple[str, ...]) -> list[str]:
    return [w for w in warnings if SAID in w]


def test_files_whose_header_is_cut_are_said_and_counted(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path, n_slices=10)
    for path in paths[-3:]:  # the last three slices: no gap shows them
        path.write_bytes(path.read_bytes()[:300])
    (header,) = discover_series(tmp_path)
    assert [s.kind for s in header.skipped] == [SkipKind.UNREADABLE] * 3
    loaded = load_series(header)
    assert loaded.volume.shape[0] == 7
    (said,) = _unreadable_warnings(loaded.warnings)
    assert said.startswith(f"3 {SAID}: DICOM without SOP Class") and said.endswith(ANALYSED_WITHOUT)
    for path in paths:
        assert path.name not in said and str(tmp_path) not in said


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_zip_members_zero_filled_or_empty_are_said(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=10)
    members = {p.name: p.read_bytes() for p in paths[:7]}
    members[paths[7].name] = bytes(paths[7].stat().st_size)  # allocated, never written
    members["IM0008"] = bytes(700)  # a PACS export's name, zeros
    members["IM0009"] = b""  # empty
    archive = _zip(tmp_path / "study.zip", members)
    (header,) = discover_series(archive)
    assert [s.kind for s in header.skipped] == [SkipKind.UNREADABLE] * 3
    loaded = load_series(header)
    assert loaded.volume.shape[0] == 7
    (said,) = _unreadable_warnings(loaded.warnings)
    assert said.startswith(f"3 {SAID}: damaged DICOM file: ")
    assert "study.zip" not in said and "IM0008" not in said


def _dicomdir() -> bytes:
    """A DICOMDIR: its class named only in the File Meta, no Series Instance UID."""
    ds = Dataset()
    ds.FileSetID = "SET"
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.1.3.10"
    ds.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=True)
    return out.getvalue()


def test_what_is_plainly_no_image_is_not_said(tmp_path: Path) -> None:
    """Text, a Mac's resource files, a DICOMDIR, a PDF: skipped as before, no warning
    (a study exported from a PACS or a CD carries such files)."""
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    members = {p.name: p.read_bytes() for p in paths}
    members |= {
        "README.TXT": b"Exported by a PACS\r\n",
        "notes": b"no extension, text\n",
        "__MACOSX/._ct1_0001.dcm": b"\x00\x05\x16\x07" + bytes(60),
        "DICOMDIR": _dicomdir(),
        "report.pdf": b"%PDF-1.4\n" + bytes(50),
        "IMAGE.JPG": b"\xff\xd8\xff\xe0" + bytes(50),
    }
    archive = _zip(tmp_path / "study.zip", members)
    (header,) = discover_series(archive)
    kinds = {s.source.member: s.kind for s in header.skipped}
    assert kinds.pop("DICOMDIR") is SkipKind.NOT_IMAGE
    assert set(kinds.values()) == {SkipKind.NOT_DICOM}, kinds
    assert not _unreadable_warnings(load_series(header).warnings)
    (tmp_path / "src" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1" + bytes(100))
    (header,) = discover_series(tmp_path / "src")
    assert [s.kind for s in header.skipped] == [SkipKind.NOT_DICOM]


def test_the_gap_a_cut_file_leaves_says_it_before_the_advice(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path, n_slices=8)
    paths[4].write_bytes(paths[4].read_bytes()[:300])
    with pytest.raises(GeometryError) as refused:
        load_series(discover_series(tmp_path)[0])
    message = refused.value.message
    assert message.startswith("missing slices: 1 gaps of 4.00 mm")
    assert f"; 1 {SAID}: DICOM without SOP Class" in message
    assert message.index(SAID) < message.index("set ingest.missing_slices: resample")


def test_every_skip_names_its_kind() -> None:
    """No default: a new reason to skip a file is sorted where it is made, never missed
    by a list of words elsewhere."""
    for cls in (SkipFile, SkippedFile):
        kind = inspect.signature(cls).parameters["kind"]
        assert kind.default is inspect.Parameter.empty, cls
