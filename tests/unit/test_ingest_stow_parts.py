"""STOW-RS parts get ingest's completeness checks before they are stored (issue 12,
item 8): a truncated part is a per-instance failure in the Store Instances Response."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from tests.factories.dicom_series import make_ct_series
from tests.factories.hostile import set_raw

from radserve.gateway.dicomweb.stow import FailureReason, StowPart, StowResult, check_part
from radserve.gateway.errors import InstanceRejectedError
from radserve.gateway.scp import instance_uids
from radserve.ingest import IngestPolicy
from radserve.ingest.headers import read_header


def _part(data: bytes) -> StowPart:
    return StowPart("application/dicom", io.BytesIO(data))


def test_truncated_part_fails_with_cannot_understand(tmp_path: Path) -> None:
    (path,) = make_ct_series(tmp_path, n_slices=1, rows=64, cols=64)
    data = path.read_bytes()
    assert len(data) > 3000
    whole = check_part(1, _part(data), None)
    cut = check_part(2, _part(data[:3000]), None)
    assert whole.stored
    assert cut.failure is FailureReason.CANNOT_UNDERSTAND
    assert "truncated" in cut.reason and cut.sop_instance_uid  # the failed item names it
    result = StowResult((whole, cut))
    assert result.http_status == 202
    failed = result.response().FailedSOPSequence
    assert [int(i.FailureReason) for i in failed] == [0xC000]
    assert StowResult((cut,)).http_status == 409


def test_frame_count_bomb_and_oversized_part(tmp_path: Path) -> None:
    (path,) = make_ct_series(tmp_path, n_slices=1)
    import pydicom

    ds = pydicom.dcmread(path)
    set_raw(ds, "NumberOfFrames", b"2147483647")
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=False)
    bomb = check_part(1, _part(buffer.getvalue()), None)
    assert bomb.failure is FailureReason.OUT_OF_RESOURCES  # above ingest.max_frames
    big = check_part(2, _part(path.read_bytes()), None, policy=IngestPolicy(max_file_bytes=100))
    assert big.failure is FailureReason.OUT_OF_RESOURCES and "max_file_bytes" in big.reason


def test_a_failed_item_carries_radserve_code_and_reason(tmp_path: Path) -> None:
    """PS3.18's Failure Reason plus radserve's code and text in a private block of the
    item: what the upload form would say of the same instance (no patient data)."""
    (path,) = make_ct_series(tmp_path, n_slices=1, rows=64, cols=64)
    cut = check_part(1, _part(path.read_bytes()[:3000]), None)
    item = StowResult((cut,)).response().to_json_dict()["00081198"]["Value"][0]
    assert item["00081197"]["Value"] == [0xC000]
    assert item["00090010"]["Value"] == ["radserve"]
    assert item["00091001"]["Value"] == [cut.code] and cut.code == "decode_failed"
    assert item["00091002"]["Value"] == [cut.reason] and "truncated" in cut.reason


def test_a_value_pydicom_cannot_convert_is_a_refused_part(tmp_path: Path) -> None:
    """Found by fuzzing (tests/fuzz instance target): pydicom converts a value when it is
    first read, so an element with an unknown VR raised NotImplementedError from the part
    check (a 500) instead of failing that part."""
    (path,) = make_ct_series(tmp_path, n_slices=1)
    data = path.read_bytes()
    uid = data.index(b"\x20\x00\x0d\x00UI")  # Study Instance UID, explicit VR "UI"
    broken = data[: uid + 4] + b"Q\x09" + data[uid + 6 :]
    outcome = check_part(1, _part(broken), None)
    assert outcome.failure is FailureReason.CANNOT_UNDERSTAND
    assert outcome.reason == "Study Instance UID missing"
    # the C-STORE SCP reads the same header and gives the same reason
    header = read_header(io.BytesIO(broken))
    with pytest.raises(InstanceRejectedError, match=r"^Study Instance UID missing$"):
        instance_uids(header, "1.2.3", image=True)


def test_every_refused_part_carries_a_code(tmp_path: Path) -> None:
    """A part of another media type, a part that is not DICOM, an instance of another
    study than the target and an SR were refused with Failure Reason and text but no
    radserve code (0009,1001): a client could not tell them apart by code."""
    import pydicom

    (path,) = make_ct_series(tmp_path, n_slices=1)
    data = path.read_bytes()
    ds = pydicom.dcmread(path)
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.88.22"
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=False)
    outcomes = (
        check_part(1, StowPart("text/plain", io.BytesIO(b"hello")), None),
        check_part(2, _part(b"x" * 500), None),
        check_part(3, _part(b""), None),
        check_part(4, _part(data), "1.2.3.4"),
        check_part(5, _part(buffer.getvalue()), None),
    )
    assert [o.code for o in outcomes] == [
        "unsupported_media_type",
        "not_dicom",
        "not_dicom",
        "invalid_request",
        "sop_class_unsupported",
    ]
    items = StowResult(outcomes).response().to_json_dict()["00081198"]["Value"]
    assert [i["00091001"]["Value"] for i in items] == [[o.code] for o in outcomes]


def test_an_object_radserve_does_not_read_is_refused_as_such_whatever_its_uids() -> None:
    """A DICOMDIR part (no Study Instance UID) was 0xC000 instance_invalid "Study Instance
    UID missing", while the form and `radserve run` pass over it (tools/edge_probe.py
    dicomdir_in_study: "the doors disagree"); it is an object radserve does not read."""
    from pydicom.dataset import Dataset, FileMetaDataset

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.1.3.10"  # Media Storage Directory
    ds.file_meta.MediaStorageSOPInstanceUID = "1.2.826.0.1.3680043.8.498.91"
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
    ds.FileSetID = "EDGE"
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    outcome = check_part(1, _part(buffer.getvalue()), None)
    assert outcome.failure is FailureReason.SOP_CLASS_NOT_SUPPORTED
    assert outcome.code == "sop_class_unsupported"
