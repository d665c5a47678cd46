"""Ingest names an instance by its Instance Number and SOP Instance UID, never by its
file. The names of files, folders and zip members are the sender's, and a PACS export
names its folders by the patient (``DOE^JOHN 123 19010203/CT/img1.dcm``); a stored
file's path is the server's. Both reached the job error (``GET /v1/jobs/{id}``, which a
read key sees and which is documented as holding no patient data), the report's
warnings and the failure notices sent to the PACS and the FHIR server: "<data dir>/
studies/0a/<hash>.zip!ZZTESTNAME^ZZ ZZPID123 19010203/CT/000.dcm: Modality MR
contradicts ...". Each message below comes from the real ingest of a zip whose folder
carries a planted name, ID and birth date."""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Callable
from pathlib import Path

import pydicom
import pytest
from pydicom.encaps import encapsulate, generate_frames
from pydicom.uid import RLELossless
from tests.factories.dicom_series import make_ct_series, new_uid

from radserve.errors import RadserveError
from radserve.ingest import IngestPolicy, discover_series, load_series

FOLDER = "ZZTESTNAME^ZZ ZZPID123 19010203/CT"
PLANTED = ("ZZTESTNAME", "ZZPID123", "19010203")


def _zipped(tmp_path: Path, paths: list[Path], member: str = "img{}.dcm") -> Path:
    """``paths`` as members of ``<FOLDER>/img<n>.dcm`` in a zip under ``tmp_path``."""
    archive = tmp_path / "stored" / "0a" / "3f9c2e.zip"  # as the server stores an upload
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for n, path in enumerate(paths, start=1):
            zf.write(path, f"{FOLDER}/{member.format(n)}")
    return archive


def _edit(path: Path, **values: object) -> None:
    ds = pydicom.dcmread(path)
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    ds.save_as(path, enforce_file_format=True)


def _refusal(archive: Path, policy: IngestPolicy | None = None) -> RadserveError:
    with pytest.raises(RadserveError) as info:
        for header in discover_series(archive, policy=policy):
            load_series(header, policy or IngestPolicy(), workers=1)
    return info.value


def _says_no_path(text: str, tmp_path: Path) -> None:
    for planted in (*PLANTED, str(tmp_path), "3f9c2e", ".zip", "img", ".dcm"):
        assert planted not in text, (planted, text)


def _uid(path: Path) -> str:
    return str(pydicom.dcmread(path, stop_before_pixels=True).SOPInstanceUID)


def _modality_contradicts(paths: list[Path]) -> None:
    _edit(paths[2], Modality="MR")  # a CT Image Storage instance saying MR


def _truncated(paths: list[Path]) -> None:
    data = paths[2].read_bytes()
    paths[2].write_bytes(data[: len(data) - 100])


def _unusable_rescale(paths: list[Path]) -> None:
    _edit(paths[2], RescaleSlope="0")


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_modality_contradicts, "Modality MR contradicts"),
        (_truncated, "the file is truncated"),
        (_unusable_rescale, "Rescale Slope is '0'"),
    ],
    ids=["modality", "truncated", "rescale"],
)
def test_an_unusable_instance_is_named_by_number_and_uid_not_by_its_member(
    tmp_path: Path, damage: Callable[[list[Path]], None], says: str
) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    damage(paths)
    error = _refusal(_zipped(tmp_path, paths))
    assert error.message.startswith(f"instance 3 (SOP Instance UID {_uid(paths[2])}): "), error
    assert says in error.message
    _says_no_path(error.message, tmp_path)


def test_several_unusable_instances_are_counted_as_instances(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    for path in paths[1:4]:
        _edit(path, RescaleSlope="0")
    error = _refusal(_zipped(tmp_path, paths))
    assert error.message.endswith("(and 2 more of the series' 6 instances)"), error.message
    _says_no_path(error.message, tmp_path)


def _with_rle_frame_of(path: Path, rows: int, cols: int) -> None:
    """``path``'s pixel data replaced by an RLE frame of a ``rows`` x ``cols`` image."""
    source = make_ct_series(
        path.parent / "frame", n_slices=1, rows=rows, cols=cols, transfer_syntax=RLELossless
    )[0]
    frame = next(generate_frames(pydicom.dcmread(source).PixelData, number_of_frames=1))
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = RLELossless
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.save_as(path, enforce_file_format=True)


def test_a_frame_that_fails_to_decode_is_named_by_its_instance_in_error_and_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The decoder's failure: the error and the DEBUG line named the file (the member's
    folders) before."""
    paths = make_ct_series(tmp_path / "src", n_slices=6, rows=40, cols=40)
    _with_rle_frame_of(paths[4], 64, 64)  # RLE segments that decode past 40 x 40
    caplog.set_level(logging.DEBUG)
    error = _refusal(_zipped(tmp_path, paths))
    assert error.code == "decode_failed", error
    assert error.message.startswith(f"instance 5 (SOP Instance UID {_uid(paths[4])}): the pixel")
    _says_no_path(error.message, tmp_path)
    assert "decoding instance 5" in caplog.text
    _says_no_path(caplog.text, tmp_path)


def test_two_files_under_one_sop_instance_uid_are_named_by_it(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    shared = _uid(paths[1])
    ds = pydicom.dcmread(paths[4])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = shared
    ds.save_as(paths[4], enforce_file_format=True)
    error = _refusal(_zipped(tmp_path, paths))
    assert "carry one SOP Instance UID but differ in position" in error.message
    assert error.message.endswith(f"(SOP Instance UID {shared})"), error.message
    _says_no_path(error.message, tmp_path)


def test_a_copy_with_other_pixels_is_named_by_its_uid(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    blank = tmp_path / "src" / "copy.dcm"
    ds = pydicom.dcmread(paths[2])
    ds.PixelData = bytes(len(ds.PixelData))
    ds.save_as(blank, enforce_file_format=True)
    error = _refusal(_zipped(tmp_path, [*paths, blank]))
    assert "hold different pixel data" in error.message, error.message
    assert error.message.endswith(f"(SOP Instance UID {_uid(paths[2])})")
    _says_no_path(error.message, tmp_path)


def test_an_unusable_geometry_value_names_an_instance(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    _edit(paths[3], ImagePositionPatient="nan\\0\\0")
    error = _refusal(_zipped(tmp_path, paths))
    assert "unusable Image Position (Patient)" in error.message, error
    assert f"e.g. instance 4 (SOP Instance UID {_uid(paths[3])}): " in error.message, error
    _says_no_path(error.message, tmp_path)


def test_a_colour_slice_names_an_instance(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    _edit(
        paths[3],
        SamplesPerPixel=3,
        PhotometricInterpretation="RGB",
        BitsAllocated=8,
        BitsStored=8,
        HighBit=7,
        PlanarConfiguration=0,
        PixelData=bytes(16 * 12 * 3),
    )
    error = _refusal(_zipped(tmp_path, paths))
    assert error.code == "unsupported_pixel_format", error
    assert f"e.g. instance 4 (SOP Instance UID {_uid(paths[3])}))" in error.message
    _says_no_path(error.message, tmp_path)


def test_an_instance_whose_uid_is_not_one_is_named_by_number_only(tmp_path: Path) -> None:
    """A hostile header may put any text where the UID goes, a name included."""
    paths = make_ct_series(tmp_path / "src", n_slices=6)
    _edit(paths[2], SOPInstanceUID="1.2.ZZTESTNAME")
    error = _refusal(_zipped(tmp_path, paths))
    assert error.message.startswith("instance 3: SOP Instance UID is not a valid UID"), error
    _says_no_path(error.message, tmp_path)


def test_a_flagged_instance_is_named_in_the_warning_by_its_instance(tmp_path: Path) -> None:
    """Padding after the last frame's pixel data: a warning the report carries."""
    paths = make_ct_series(tmp_path / "src", n_slices=6, study_uid=new_uid())
    ds = pydicom.dcmread(paths[1])
    ds.PixelData = ds.PixelData + bytes(64)  # 64 bytes past Rows x Columns
    ds.save_as(paths[1], enforce_file_format=True)
    (header,) = discover_series(_zipped(tmp_path, paths))
    loaded = load_series(header)
    [flagged] = [w for w in loaded.warnings if "after the last frame" in w]
    assert flagged.startswith(f"instance 2 (SOP Instance UID {_uid(paths[1])}): "), flagged
    _says_no_path(flagged, tmp_path)
