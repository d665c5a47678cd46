"""Content-addressed study storage: fingerprint, dedupe, durability, limits."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from radserve.errors import StudyError
from radserve.service.upload_key import upload_fingerprint
from radserve.store.files import (
    UploadTooLargeError,
    fingerprint_digests,
    fingerprint_files,
    remove_stale_staging,
    store_study,
    store_study_files,
    study_dir,
)

A, B, C = b"instance a" * 10, b"instance b" * 10, b"instance c" * 10


def upload(*items: tuple[str, bytes]) -> list[tuple[str, io.BytesIO]]:
    return [(name, io.BytesIO(data)) for name, data in items]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fingerprint_is_sha256_over_sorted_instance_hashes() -> None:
    expected = hashlib.sha256("\n".join(sorted([sha(A), sha(B)])).encode()).hexdigest()
    assert fingerprint_digests([sha(B), sha(A)]) == expected
    assert fingerprint_digests([sha(A), sha(B), sha(A)]) == expected


def test_study_is_stored_under_its_fingerprint(tmp_path: Path) -> None:
    stored = store_study(tmp_path, upload(("Doe^John_1.dcm", A), ("2.DCM", B), ("vol.nii.gz", C)))
    assert stored.fingerprint == fingerprint_digests([sha(A), sha(B), sha(C)])
    assert stored.path == study_dir(tmp_path, stored.fingerprint)
    assert stored.path == tmp_path / "studies" / stored.fingerprint[:2] / stored.fingerprint
    names = sorted(p.name for p in stored.instances)
    assert names == sorted([f"{sha(A)}.dcm", f"{sha(B)}.dcm", f"{sha(C)}.nii.gz"])
    assert not any("Doe" in p.name for p in stored.instances)  # sender's names are dropped
    assert stored.total_bytes == len(A) + len(B) + len(C)
    assert not stored.existed
    assert fingerprint_files(stored.instances) == stored.fingerprint
    assert list((tmp_path / "staging").iterdir()) == []


def test_identical_study_is_stored_once(tmp_path: Path) -> None:
    first = store_study(tmp_path, upload(("a.dcm", A), ("b.dcm", B)))
    second = store_study(tmp_path, upload(("x.dcm", B), ("y.dcm", A), ("dup.dcm", A)))
    assert second.fingerprint == first.fingerprint and second.path == first.path
    assert second.existed
    assert len(second.instances) == 2


def test_files_on_disk_can_be_stored(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "1.dcm").write_bytes(A)
    stored = store_study_files(tmp_path / "data", [src / "1.dcm"])
    assert stored.instances[0].read_bytes() == A


def test_upload_over_the_limit_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(UploadTooLargeError, match="exceeds the limit of 150 bytes"):
        store_study(tmp_path, upload(("a.dcm", A), ("b.dcm", B)), max_bytes=150)
    assert not (tmp_path / "studies").exists()
    assert list((tmp_path / "staging").iterdir()) == []


def test_empty_upload_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="no files"):
        store_study(tmp_path, [])


def test_interrupted_uploads_are_cleaned_at_start(tmp_path: Path) -> None:
    assert remove_stale_staging(tmp_path) == 0
    (tmp_path / "staging" / "abc").mkdir(parents=True)
    (tmp_path / "staging" / "abc" / ".part-0").write_bytes(b"half")
    stored = store_study(tmp_path, upload(("a.dcm", A)))
    assert remove_stale_staging(tmp_path) == 1
    assert list((tmp_path / "staging").iterdir()) == []
    assert stored.instances[0].read_bytes() == A


def _zip(
    members: list[tuple[str, bytes]], *, method: int = zipfile.ZIP_DEFLATED, year: int
) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for name, data in members:
            archive.writestr(zipfile.ZipInfo(name, date_time=(year, 1, 2, 3, 4, 6)), data)
    return buffer.getvalue()


def test_a_study_zipped_has_the_fingerprint_of_its_files_however_it_was_zipped(
    tmp_path: Path,
) -> None:
    """Before session 43 a zip's own bytes were its instance: the same files zipped
    again (another time in each member's header, another tool) were a new study."""
    files = store_study(tmp_path, upload(("a.dcm", A), ("b.dcm", B)))
    first_zip = _zip([("s/1.dcm", A), ("s/2.dcm", B)], year=2020)
    again = _zip([("IMG2", B), ("x/IMG1", A), ("x/", b"")], method=zipfile.ZIP_STORED, year=2026)
    assert first_zip != again
    for archive in (first_zip, again):
        zipped = store_study(tmp_path, upload(("upload.zip", archive)))
        assert zipped.fingerprint == files.fingerprint and zipped.existed
        assert upload_fingerprint(upload(("upload.zip", archive))) == files.fingerprint
    mixed = store_study(
        tmp_path / "m", upload(("upload.zip", _zip([("1", A)], year=2021)), ("b.dcm", B))
    )
    assert mixed.fingerprint == files.fingerprint
    assert fingerprint_files(mixed.instances) == mixed.fingerprint


@pytest.mark.parametrize(
    "archive",
    [
        _zip([("1.dcm", A), ("../2.dcm", B)], year=2020),  # a member ingest skips
        _zip([("1.dcm", A), ("inner.zip", B)], year=2020),  # a nested archive
        _zip([("1.dcm", A), ("2.dcm", B)], year=2020)[:-30],  # cut off: no end record
        b"PK\x03\x04" + b"\x00" * 100,  # no archive at all
    ],
    ids=["unsafe-member", "nested-zip", "truncated", "not-a-zip"],
)
def test_an_archive_ingest_would_not_read_whole_keeps_its_own_digest(
    tmp_path: Path, archive: bytes
) -> None:
    stored = store_study(tmp_path, upload(("upload.zip", archive)))
    assert stored.fingerprint == fingerprint_digests([sha(archive)])
    assert [p.name for p in stored.instances] == [f"{sha(archive)}.zip"]
    assert upload_fingerprint(upload(("upload.zip", archive))) == stored.fingerprint
