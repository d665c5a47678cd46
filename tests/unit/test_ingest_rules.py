"""One rule per door (radserve.ingest.rules): an instance with a UID that breaks PS3.5 9.1,
or in a transfer syntax refused on purpose, gets the same answer with the same reason at
C-STORE, STOW-RS, the upload form and `radserve run`; two different instances under one
SOP Instance UID are named at every door, also when they arrive in two associations or
requests. Found by tools/edge_probe.py: the form and `radserve run` accepted invalid UIDs
and read Big Endian, which STOW-RS refused; C-STORE and STOW-RS kept the first of two
different instances under one UID, and the study then failed on the gap."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import ExplicitVRBigEndian
from tests.factories.dicom_series import make_ct_series

from radserve.errors import StudyError
from radserve.gateway import conformance
from radserve.gateway.dicomweb.stow import FailureReason, StowIntake, StowPart, check_part
from radserve.gateway.errors import InstanceRejectedError
from radserve.gateway.storage import InstanceStore, check_uid
from radserve.ingest import discover_series, load_series
from radserve.ingest.rules import REFUSED_TRANSFER_SYNTAXES, uid_problem

# the variants are invalid on purpose: pydicom warns when they are written
pytestmark = pytest.mark.filterwarnings("ignore:.*VR UI:UserWarning")


def _letters(ds: pydicom.Dataset, k: int) -> None:
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = f"1.2.826.abc.{k + 1}"


def _long_sop(ds: pydicom.Dataset, k: int) -> None:
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = "1." + "2" * 66 + f".{k}"


def _long_study(ds: pydicom.Dataset, k: int) -> None:
    ds.StudyInstanceUID = "1." + "3" * 70


UID_VARIANTS: dict[str, tuple[Callable[[pydicom.Dataset, int], None], str, str]] = {
    "letters": (_letters, "SOP Instance UID", "SOPInstanceUID"),
    "long_sop": (_long_sop, "SOP Instance UID", "SOPInstanceUID"),
    "long_study": (_long_study, "Study Instance UID", "StudyInstanceUID"),
}


def _edited(folder: Path, change: Callable[[pydicom.Dataset, int], None]) -> list[Path]:
    paths = make_ct_series(folder, n_slices=4)
    for k, path in enumerate(paths):
        ds = pydicom.dcmread(path)
        change(ds, k)
        ds.save_as(path, enforce_file_format=True)
    return paths


def _form_or_run(folder: Path) -> StudyError:
    """What the upload form and `radserve run` do with a folder: discover, then load."""
    with pytest.raises(StudyError) as info:
        load_series(discover_series(folder)[0])
    return info.value


@pytest.mark.parametrize("name", sorted(UID_VARIANTS))
def test_an_invalid_uid_is_refused_at_every_door_with_one_reason(tmp_path: Path, name: str) -> None:
    change, what, keyword = UID_VARIANTS[name]
    paths = _edited(tmp_path / "study", change)
    value = getattr(pydicom.dcmread(paths[0]), keyword)
    reason = uid_problem(value, what)
    assert reason is not None and value not in reason  # the rule's words, never the value
    # the upload form and `radserve run`
    error = _form_or_run(tmp_path / "study")
    assert error.code == "instance_invalid"
    assert reason in error.message
    # STOW-RS: a failed item, Cannot Understand, with that reason
    outcome = check_part(1, StowPart("application/dicom", io.BytesIO(paths[0].read_bytes())), None)
    assert outcome.failure is FailureReason.CANNOT_UNDERSTAND
    assert (outcome.reason, outcome.code) == (reason, error.code)
    # C-STORE: the SCP checks the received data set's UIDs before storing it
    with pytest.raises(InstanceRejectedError) as refused:
        check_uid(value, what)
    assert (refused.value.message, refused.value.code) == (reason, error.code)


def test_big_endian_is_refused_at_every_door_with_one_reason(tmp_path: Path) -> None:
    """Explicit VR Big Endian (retired): the SCP does not accept it in negotiation,
    STOW-RS answers 0xC122, the form and `radserve run` refuse the file, one reason."""
    paths = make_ct_series(tmp_path / "study", n_slices=4)
    for path in paths:
        ds = pydicom.dcmread(path)
        pixels = ds.pixel_array
        ds.PixelData = pixels.astype(pixels.dtype.newbyteorder(">")).tobytes()
        ds.file_meta.TransferSyntaxUID = ExplicitVRBigEndian
        pydicom.dcmwrite(path, ds, implicit_vr=False, little_endian=False, force_encoding=True)
    reason = REFUSED_TRANSFER_SYNTAXES[ExplicitVRBigEndian]
    error = _form_or_run(tmp_path / "study")
    assert error.code == "instance_invalid" and reason in error.message
    outcome = check_part(1, StowPart("application/dicom", io.BytesIO(paths[0].read_bytes())), None)
    assert outcome.failure is FailureReason.TRANSFER_SYNTAX_NOT_SUPPORTED
    assert (outcome.reason, outcome.code) == (reason, error.code)
    assert ExplicitVRBigEndian not in conformance.SCP_TRANSFER_SYNTAXES
    ct = "1.2.840.10008.5.1.4.1.1.2"
    assert reason in conformance.refused_context(ct, [ExplicitVRBigEndian], 0x04)


def _reused_uid(folder: Path) -> list[Path]:
    """Slice 3 carries slice 2's SOP Instance UID (another position and pixels)."""
    paths = make_ct_series(folder, n_slices=4)
    ds = pydicom.dcmread(paths[3])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = pydicom.dcmread(
        paths[2]
    ).SOPInstanceUID
    ds.save_as(paths[3], enforce_file_format=True)
    return paths


def test_one_uid_on_two_images_arriving_apart_is_named(tmp_path: Path) -> None:
    """C-STORE and STOW-RS (quiet): the two files arrive in two associations/requests;
    the second is kept beside the first (other bytes), and ingest names both."""
    paths = _reused_uid(tmp_path / "sent")
    store = InstanceStore(tmp_path / "gateway")
    for path in paths:  # one save per association, as the SCP does it
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        saved = store.save(
            path.read_bytes(),
            study_instance_uid=ds.StudyInstanceUID,
            sop_instance_uid=ds.SOPInstanceUID,
            sop_class_uid=ds.SOPClassUID,
        )
    with pytest.raises(StudyError) as info:
        discover_series(saved.path.parent)
    assert info.value.code == "instance_invalid"
    assert "carry one SOP Instance UID but differ in position" in info.value.message
    # the very same bytes again (a retry) stay one file
    again = store.save(
        paths[0].read_bytes(),
        study_instance_uid=ds.StudyInstanceUID,
        sop_instance_uid=pydicom.dcmread(paths[0]).SOPInstanceUID,
        sop_class_uid=ds.SOPClassUID,
    )
    assert again.disposition.value == "duplicate"
    assert len(list(saved.path.parent.glob("*.dcm"))) == 4


def test_one_uid_on_two_images_in_one_stow_request_is_named(tmp_path: Path) -> None:
    """STOW-RS (completeness request): both parts go to the server's submit, whose
    ingest names the conflict; before, the second part was answered stored and dropped."""
    paths = _reused_uid(tmp_path / "sent")
    messages: list[str] = []

    def submit(streams: list[io.BufferedIOBase], refused: object) -> str:
        folder = tmp_path / f"upload-{len(messages)}"
        folder.mkdir()
        for k, stream in enumerate(streams):
            (folder / f"part-{k}.dcm").write_bytes(stream.read())
        try:
            discover_series(folder)
        except StudyError as exc:
            messages.append(exc.message)
            raise
        return "job"

    intake: StowIntake[str] = StowIntake(lambda *a: None, data_dir=tmp_path / "data")
    parts = [StowPart("application/dicom", io.BytesIO(p.read_bytes())) for p in paths]
    result = intake.store(parts, target_study=None, submit=submit, retry_after=1)
    assert result.http_status == 409
    assert [m for m in messages if "carry one SOP Instance UID" in m]
    assert not np.any([i.stored for i in result.instances])
