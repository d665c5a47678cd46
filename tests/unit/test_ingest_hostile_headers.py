"""Issue 12, items 1–6: what a hostile or broken header asks for is checked against the
file before anything is allocated, and every refusal is one line naming the instance
(by Instance Number and SOP Instance UID: never the file, whose name is the sender's)."""

from __future__ import annotations

import io
import logging
import zipfile
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import DeflatedExplicitVRLittleEndian
from tests.factories.dicom_series import make_ct_series, make_enhanced_series
from tests.factories.hostile import set_raw

from radserve.domain.volume import Volume
from radserve.errors import DecodeError, GeometryError, RadserveError
from radserve.ingest import (
    IngestPolicy,
    InputTooLargeError,
    InstanceError,
    SeriesAttributeError,
    discover_series,
    load_series,
)
from radserve.ingest.headers import SkipFile, read_stream
from radserve.ingest.sources import SourceFile
from radserve.preprocess.resample import resample_to_spacing


def _series(folder: Path, **kwargs: object) -> list[Path]:
    return make_ct_series(folder, n_slices=4, rows=16, cols=12, **kwargs)  # type: ignore[arg-type]


def _edit(path: Path, **raw: bytes) -> None:
    ds = pydicom.dcmread(path)
    for keyword, value in raw.items():
        set_raw(ds, keyword, value)
    ds.save_as(path, enforce_file_format=False)


def _named(path: Path) -> str:
    """How a refusal names the instance in ``path`` (never by the file's name or path)."""
    ds = pydicom.dcmread(path, stop_before_pixels=True, force=True)
    return f"instance {ds.InstanceNumber} (SOP Instance UID {ds.SOPInstanceUID}): "


def _load_error(folder: Path, policy: IngestPolicy | None = None) -> RadserveError:
    with pytest.raises(RadserveError) as info:
        for header in discover_series(folder, policy=policy):
            load_series(header, policy or IngestPolicy())
    error = info.value
    assert "\n" not in error.message
    return error


# --- 1. NumberOfFrames bombs --------------------------------------------------------------------
@pytest.mark.parametrize("frames", [b"1e9", b"2147483647", b"1000000", b"0", b"-3", b"abc"])
def test_frame_count_is_checked_against_the_pixel_data(tmp_path: Path, frames: bytes) -> None:
    paths = _series(tmp_path)
    _edit(paths[1], NumberOfFrames=frames)
    headers = discover_series(tmp_path)
    # One record for the file, however many frames it claims.
    assert sum(h.number_of_frames for h in headers) == 4
    error = _load_error(tmp_path)
    assert isinstance(error, DecodeError | InstanceError | InputTooLargeError)
    assert error.message.startswith(_named(paths[1]))
    assert "Number of Frames" in error.message


def test_enhanced_ct_claiming_a_million_frames_without_functional_groups(tmp_path: Path) -> None:
    path = make_enhanced_series(tmp_path, n_frames=3)
    ds = pydicom.dcmread(path)
    set_raw(ds, "NumberOfFrames", b"1000000")
    ds.PerFrameFunctionalGroupsSequence = []
    ds.save_as(path, enforce_file_format=False)
    (header,) = discover_series(tmp_path)
    assert header.number_of_frames == 1
    with pytest.raises(InputTooLargeError, match=r"Number of Frames is 1000000, more than"):
        load_series(header)
    # Under a limit that allows the claim, the pixel data still refuses it.
    policy = IngestPolicy(max_frames=2_000_000)
    (header,) = discover_series(tmp_path, policy=policy)
    with pytest.raises(DecodeError, match=r"1000000 frames of 16 × 12 .* need"):
        load_series(header, policy)


def test_study_frame_budget(tmp_path: Path) -> None:
    _series(tmp_path)
    with pytest.raises(InputTooLargeError, match="max_frames=3"):
        discover_series(tmp_path, policy=IngestPolicy(max_frames=3))


# --- 2. element and decompression bombs ---------------------------------------------------------
def _with_private_blob(path: Path, size: int) -> None:
    ds = pydicom.dcmread(path)
    ds.add_new(0x00090010, "LO", "RADSERVE TEST")
    ds.add_new(0x00091000, "OB", bytes(size))
    ds.save_as(path, enforce_file_format=False)


def test_large_private_element_is_skipped_not_read(tmp_path: Path) -> None:
    paths = _series(tmp_path / "study")
    _with_private_blob(paths[0], 8 * 2**20)
    archive = tmp_path / "study.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in paths:
            zf.write(path, path.name)
    # A header budget far below the element: it is skipped by seeking, never read.
    policy = IngestPolicy(max_header_bytes=256 * 1024)
    for source in (tmp_path / "study", archive):
        (header,) = discover_series(source, policy=policy)
        loaded = load_series(header, policy)
        assert loaded.volume.shape == (4, 16, 12)


def test_file_and_study_byte_limits(tmp_path: Path) -> None:
    paths = _series(tmp_path)
    _with_private_blob(paths[0], 2 * 2**20)
    with pytest.raises(InputTooLargeError, match="max_study_bytes=1000000"):
        discover_series(tmp_path, policy=IngestPolicy(max_study_bytes=1_000_000))
    policy = IngestPolicy(max_file_bytes=1_000_000)
    error = _load_error(tmp_path, policy)
    assert isinstance(error, InputTooLargeError)
    assert (
        error.message.startswith(f"{_named(paths[0])}the file is ")
        and "max_file_bytes" in error.message
    )


def test_deflate_bomb_is_refused_while_inflating(tmp_path: Path) -> None:
    paths = _series(tmp_path)
    ds = pydicom.dcmread(paths[0])
    ds.add_new(0x00090010, "LO", "RADSERVE TEST")
    ds.add_new(0x00091000, "OB", bytes(16 * 2**20))
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    ds.save_as(paths[0], enforce_file_format=False)
    assert paths[0].stat().st_size < 200_000
    (header,) = discover_series(tmp_path, policy=IngestPolicy(max_file_bytes=4 * 2**20))
    assert {s.source.path for s in header.skipped} == {paths[0]}
    assert "max_file_bytes" in header.skipped[0].reason
    # Within the limit, the deflated file is read and decoded (inflated, bounded, by radserve).
    (header,) = discover_series(tmp_path)
    assert load_series(header).volume.shape == (4, 16, 12)


def test_element_claiming_more_bytes_than_the_file_holds(tmp_path: Path) -> None:
    paths = _series(tmp_path)
    data = bytearray(paths[1].read_bytes())
    at = bytes(data).find(b"\x10\x00\x10\x00PN")  # Patient's Name
    data[at:at] = b"\x09\x00\x00\x10OB\x00\x00" + (0x7FFFFFF0).to_bytes(4, "little")
    paths[1].write_bytes(bytes(data))
    (header,) = discover_series(tmp_path)  # skipped or refused, never allocated
    assert header.number_of_instances in (3, 4)


# --- 3. geometry that explodes --------------------------------------------------------------------
@pytest.mark.parametrize(
    "spacing",
    [b"1e4\\1e4", b"1e30\\1e30", b"1e308\\1e308", b"100\\100", b"0.01\\10000", b"0\\0", b"-1\\-1"],
)
def test_pixel_spacing_outside_sane_bounds(tmp_path: Path, spacing: bytes) -> None:
    for path in _series(tmp_path):
        _edit(path, PixelSpacing=spacing)
    error = _load_error(tmp_path)
    assert isinstance(error, GeometryError)
    assert "Pixel Spacing" in error.message and "mm" in error.message


def test_unusable_pixel_spacing_is_named_with_its_value(tmp_path: Path) -> None:
    for path in _series(tmp_path):
        _edit(path, PixelSpacing=b"nan\\1")
    error = _load_error(tmp_path)
    assert "unusable Pixel Spacing" in error.message and "'nan\\\\1'" in error.message


@pytest.mark.parametrize(
    ("keyword", "value", "count"),
    [
        ("PixelSpacing", b"0.7", 2),
        ("PixelSpacing", b"0.7\\0.7\\0.7", 2),
        ("PixelSpacing", b"0,7\\0,7", 2),
        ("ImagePositionPatient", b"0\\0", 3),
        ("ImageOrientationPatient", b"1\\0\\0\\0\\1", 6),
    ],
)
def test_a_geometry_value_of_the_wrong_count_or_notation_says_what_it_must_be(
    tmp_path: Path, keyword: str, value: bytes, count: int
) -> None:
    """Round 5 (session 21): "Pixel Spacing '0.7'; it must be finite numbers" named a
    finite number as the fault; the message now says how many, and how written."""
    for path in _series(tmp_path):
        _edit(path, **{keyword: value})
    error = _load_error(tmp_path)
    assert isinstance(error, GeometryError)
    assert f"it must be {count} finite numbers separated by backslashes" in error.message


def test_slice_spacing_and_field_of_view_bounds(tmp_path: Path) -> None:
    _series(tmp_path / "a", spacing=(80.0, 0.7, 0.9))
    assert "slice spacing" in _load_error(tmp_path / "a").message
    _series(tmp_path / "b", spacing=(2.0, 0.7, 0.9))
    error = _load_error(tmp_path / "b", IngestPolicy(max_fov_mm=5.0))
    assert "max_fov_mm=5" in error.message
    for path in _series(tmp_path / "c"):
        _edit(path, ImagePositionPatient=b"1e308\\0\\0")
    assert "Image Position (Patient)" in _load_error(tmp_path / "c").message


@pytest.mark.parametrize("iop", [b"0\\0\\0\\0\\0\\0", b"1\\0\\0\\1\\0\\0", b"2\\0\\0\\0\\2\\0"])
def test_degenerate_orientation(tmp_path: Path, iop: bytes) -> None:
    for path in _series(tmp_path):
        _edit(path, ImageOrientationPatient=iop)
    error = _load_error(tmp_path)
    assert isinstance(error, GeometryError) and "Image Orientation" in error.message


def test_resampling_guard_refuses_an_absurd_grid() -> None:
    volume = Volume(np.zeros((2, 4, 4), np.int16), np.diag([1e6, 1e6, 1e6, 1.0]), None, ())
    with pytest.raises(GeometryError, match="voxels"):
        resample_to_spacing(volume, (1.0, 1.0, 1.0), order=1)
    with pytest.raises(GeometryError, match="voxels"):
        resample_to_spacing(volume, (1e-300, 1.0, 1.0), order=1)


# --- 4. what the outputs need, checked at ingest -----------------------------------------------
def test_missing_study_uid_and_frame_of_reference_are_refused(tmp_path: Path) -> None:
    for keyword, match in (
        ("StudyInstanceUID", "no Study Instance UID"),
        ("FrameOfReferenceUID", "no Frame of Reference UID"),
    ):
        folder = tmp_path / keyword
        for path in _series(folder):
            ds = pydicom.dcmread(path)
            delattr(ds, keyword)
            ds.save_as(path)
        with pytest.raises(SeriesAttributeError, match=match):
            load_series(discover_series(folder)[0])


def test_mixed_study_uids_in_a_series_are_refused(tmp_path: Path) -> None:
    paths = _series(tmp_path)
    ds = pydicom.dcmread(paths[2])
    ds.StudyInstanceUID = pydicom.uid.generate_uid()
    ds.save_as(paths[2])
    with pytest.raises(SeriesAttributeError, match="2 different Study Instance UIDs"):
        load_series(discover_series(tmp_path)[0])


def test_unknown_sop_class_is_refused_before_inference(tmp_path: Path) -> None:
    _series(tmp_path, sop_class_uid="1.2.3.4.5.6")
    with pytest.raises(SeriesAttributeError, match="unknown SOP Class") as info:
        load_series(discover_series(tmp_path)[0])
    assert info.value.code == "sop_class_unsupported"


def test_absent_type2_attributes_are_flagged(tmp_path: Path) -> None:
    for path in _series(tmp_path):
        ds = pydicom.dcmread(path)
        del ds.PatientID, ds.SliceThickness
        ds.save_as(path)
    loaded = load_series(discover_series(tmp_path)[0])
    (warning,) = [w for w in loaded.warnings if "Type 2" in w]
    assert "PatientID" in warning and "SliceThickness" in warning


# --- 5. silently accepted nonsense -------------------------------------------------------------
@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("RescaleSlope", b"0"),
        ("RescaleSlope", b"nan"),
        ("RescaleSlope", b"inf"),
        ("RescaleSlope", b"abc"),
        ("RescaleSlope", b"1\\2"),
        ("RescaleIntercept", b"1e30"),
        ("RescaleIntercept", b"-inf"),
    ],
)
def test_unusable_rescale_is_refused_not_treated_as_identity(
    tmp_path: Path, keyword: str, value: bytes
) -> None:
    paths = _series(tmp_path)
    _edit(paths[3], **{keyword: value})
    error = _load_error(tmp_path)
    assert isinstance(error, InstanceError)
    name = "Rescale Slope" if keyword == "RescaleSlope" else "Rescale Intercept"
    assert error.message.startswith(f"{_named(paths[3])}{name} is ")


def test_patient_data_planted_in_a_numeric_field_is_not_echoed(tmp_path: Path) -> None:
    paths = _series(tmp_path)
    _edit(paths[0], RescaleSlope=b"Doe^John")
    error = _load_error(tmp_path)
    assert "Doe" not in error.message and "not a number" in error.message


@pytest.mark.parametrize(
    ("edits", "match"),
    [
        ({"Rows": (8).to_bytes(2, "little")}, "room for more frames than"),
        ({"Rows": (64).to_bytes(2, "little")}, "need"),
        ({"PhotometricInterpretation": b"RGB"}, "RGB with Samples per Pixel 1"),
        (
            {"SamplesPerPixel": (3).to_bytes(2, "little")},
            "MONOCHROME2 with Samples per Pixel 3",
        ),
        ({"BitsAllocated": (7).to_bytes(2, "little")}, "Bits Allocated"),
        ({"BitsStored": (17).to_bytes(2, "little")}, "Bits Stored 17"),
    ],
)
def test_pixel_format_inconsistent_with_the_data(
    tmp_path: Path, edits: dict[str, bytes], match: str
) -> None:
    paths = _series(tmp_path)
    _edit(paths[1], **edits)
    # Other Rows split the file into a part of its own (the main part then has a gap).
    (header,) = [h for h in discover_series(tmp_path) if paths[1] in {f.path for f in h.files}]
    with pytest.raises(RadserveError) as info:
        load_series(header)
    error = info.value
    assert error.message.startswith(_named(paths[1]))
    assert pytest.importorskip("re").search(match, error.message), error.message


# --- 6. one line, the file, no traceback ----------------------------------------------------------
def test_decoder_fallbacks_print_no_tracebacks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from pydicom.uid import JPEG2000Lossless

    folder = tmp_path / "j2k"
    compressed = make_ct_series(
        folder, n_slices=4, rows=32, cols=32, transfer_syntax=JPEG2000Lossless
    )
    data = bytearray(compressed[1].read_bytes())
    start = len(data) - 200
    data[start : start + 150] = b"\x00" * 150  # damaged codestream in a complete file
    compressed[1].write_bytes(bytes(data))
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(handler)
    try:
        with caplog.at_level(logging.INFO):
            try:
                load_series(discover_series(folder)[0], workers=1)
            except RadserveError as exc:
                assert "\n" not in exc.message and exc.message.startswith(_named(compressed[1]))
    finally:
        logging.getLogger().removeHandler(handler)
    assert "Traceback" not in stream.getvalue()
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= logging.INFO]
    assert "Traceback" not in capsys.readouterr().err


def test_a_deflated_data_set_without_preamble_is_inflated_within_the_bound(
    tmp_path: Path,
) -> None:
    """pydicom inflates a Deflated data set whole, in memory, when it finds one: also in a
    file without the 128-byte preamble and 'DICM' (read as a legacy stream), which is
    inflated by radserve, bounded, like any other Deflated file."""
    path = _series(tmp_path)[0]
    ds = pydicom.dcmread(path)
    ds.add_new(0x00090010, "LO", "RADSERVE TEST")
    ds.add_new(0x00091000, "OB", bytes(16 * 2**20))
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    ds.save_as(path, enforce_file_format=True)
    bare = path.read_bytes()[132:]  # group 0002 first, as a legacy stream starts
    src = SourceFile(path)
    with pytest.raises(SkipFile, match="max_file_bytes"):
        read_stream(io.BytesIO(bare), len(bare), src, IngestPolicy(max_file_bytes=4 * 2**20))
    record = read_stream(io.BytesIO(bare), len(bare), src, IngestPolicy())
    assert record.frames[0].pixel.transfer_syntax_uid == DeflatedExplicitVRLittleEndian
    assert record.frames[0].problem is None
