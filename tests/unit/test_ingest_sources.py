"""Inputs that are not clean DICOM: garbage, truncation, unsafe and oversized zips."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from pydicom.data import get_testdata_file
from tests.factories.dicom_series import make_ct_series, truncate, write_not_dicom

from radserve.errors import DecodeError, NotDicomError
from radserve.ingest import ArchiveRejectedError, discover_series, load_series


def test_non_dicom_files_are_skipped_and_listed(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=3)
    write_not_dicom(tmp_path / "readme.txt")
    write_not_dicom(tmp_path / "fake.dcm", b"\0" * 128 + b"DICM" + bytes(range(256)) * 8)
    (header,) = discover_series(tmp_path)
    reasons = {s.source.name: s.reason for s in header.skipped}
    assert reasons["readme.txt"] == "not DICOM (no 'DICM' marker)"
    # pydicom is lenient: garbage after the marker parses into a dataset without UIDs.
    assert reasons["fake.dcm"].startswith(("unreadable DICOM header", "DICOM without SOP"))


def test_only_garbage_raises_not_dicom_with_reasons(tmp_path: Path) -> None:
    write_not_dicom(tmp_path / "a.bin")
    sr = get_testdata_file("test-SR.dcm", download=False)
    if sr is not None:
        (tmp_path / "report.dcm").write_bytes(Path(sr).read_bytes())
    with pytest.raises(NotDicomError, match=r"no DICOM image series found in \d files \(.*DICM"):
        discover_series([tmp_path, tmp_path / "missing"])


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(NotDicomError, match="in 0 files"):
        discover_series(tmp_path)


def test_truncated_header_is_skipped(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path, n_slices=3)
    truncate(paths[1], keep_fraction=0.2)
    (header,) = discover_series(tmp_path)
    assert header.number_of_instances == 2
    assert header.skipped[0].source.path == paths[1]


def test_truncated_pixel_data_gives_decode_error(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path, n_slices=3)
    truncate(paths[1], keep_fraction=0.9)
    (header,) = discover_series(tmp_path)
    # Found from the header, before decoding: one line naming the instance (its number
    # and UID), never the file (its name is the sender's)
    with pytest.raises(
        DecodeError, match=r"^instance 2 \(SOP Instance UID [0-9.]+\): the file is truncated: Pixel"
    ) as refused:
        load_series(header)
    assert paths[1].name not in refused.value.message


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_zip_with_unsafe_members(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=3)
    members = {f"study/{p.name}": p.read_bytes() for p in paths}
    members |= {"../evil.dcm": paths[0].read_bytes(), "/abs.dcm": b"x", "inner.zip": b"PK"}
    archive = _zip(tmp_path / "upload.zip", members)
    (header,) = discover_series(archive)
    assert header.number_of_instances == 3
    assert all(f.member and f.member.startswith("study/") for f in header.files)
    reasons = sorted(s.reason for s in header.skipped)
    assert reasons == [
        "nested zip archives are not read",
        "unsafe member path in zip (absolute or '..')",
        "unsafe member path in zip (absolute or '..')",
    ]


def test_zip_members_sharing_a_name_are_each_read(tmp_path: Path) -> None:
    """Two members of one name (an archive appended to, a tool that flattened folders):
    each was opened by its name, which reads the last of them twice, so a slice was
    lost without a word and the volume came out shorter."""
    paths = make_ct_series(tmp_path / "src", n_slices=5)
    archive = tmp_path / "upload.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in paths[:-1]:
            zf.writestr(path.name, path.read_bytes())
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr(paths[0].name, paths[-1].read_bytes())  # the last slice, misnamed
    (header,) = discover_series(archive)
    assert header.number_of_instances == 5
    loaded = load_series(header)
    assert loaded.volume.shape[0] == 5
    assert (
        loaded.volume.array.tobytes()
        == load_series(discover_series(tmp_path / "src")[0]).volume.array.tobytes()
    )


def test_zip_bomb_is_rejected(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "bomb.zip", {"zeros.dcm": bytes(5_000_000)})
    assert archive.stat().st_size < 50_000
    with pytest.raises(ArchiveRejectedError, match="possible zip bomb"):
        discover_series(archive, max_archive_bytes=1_000_000)


def test_corrupt_zip_is_skipped(tmp_path: Path) -> None:
    make_ct_series(tmp_path / "s", n_slices=2)
    write_not_dicom(tmp_path / "broken.zip", b"PK\x03\x04 not really a zip")
    (header,) = discover_series(tmp_path)
    assert header.skipped[0].reason.startswith("not a readable zip archive")


def test_fifo_is_skipped_not_read(tmp_path: Path) -> None:
    import os

    make_ct_series(tmp_path, n_slices=2)
    os.mkfifo(tmp_path / "pipe")
    (header,) = discover_series(tmp_path)
    assert [(s.source.name, s.reason) for s in header.skipped] == [("pipe", "not a regular file")]
