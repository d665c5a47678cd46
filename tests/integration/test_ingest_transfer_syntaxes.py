"""Every transfer syntax we can get a file for either decodes exactly or fails clearly.

Sources: pydicom's own test files that are installed locally (never downloaded), and the
synthetic factory series re-encoded with pydicom's encoders and, where installed, dcmtk.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.pixels import get_decoder
from pydicom.uid import (
    JPEG2000,
    MPEG2MPML,
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGExtended12Bit,
    JPEGLSLossless,
    RLELossless,
    SecondaryCaptureImageStorage,
    generate_uid,
)
from tests.factories.dicom_series import dcmtk_compress, make_ct_series, ramp_hu

from radserve.errors import DecodeError, NotDicomError, StudyError
from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.ingest.decode import decode_stack
from radserve.ingest.rules import REFUSED_TRANSFER_SYNTAXES
from radserve.ingest.sources import SourceReader

_TEST_DIR = Path(pydicom.data.__file__).parent / "test_files"
LOCAL_FILES = sorted(_TEST_DIR.glob("*.dcm"))
MR_FAMILY = [
    "MR_small_RLE.dcm",
    "MR_small_jp2klossless.dcm",
    "MR_small_jpeg_ls_lossless.dcm",
    "MR_small_implicit.dcm",
    "MR_small_padded.dcm",
]


def _testdata(name: str) -> Path:
    path = get_testdata_file(name, download=False)
    if path is None:
        pytest.skip(f"pydicom test file {name} not installed")
    return Path(path)


@pytest.mark.parametrize("path", LOCAL_FILES, ids=lambda p: p.name)
def test_every_pydicom_file_loads_or_fails_clearly(path: Path) -> None:
    """Never an unhandled exception type: a volume, a skip, or a StudyError with a reason."""
    try:
        headers = discover_series(path)
    except NotDicomError as exc:
        assert "no DICOM image series" in exc.message
        return
    for header in headers:
        try:
            loaded = load_series(header, IngestPolicy(missing_slices="flag"))
        except DecodeError as exc:
            # One line naming the instance (and, when decoding failed, the syntax); never
            # the file, whose name and folders are the sender's
            assert "\n" not in exc.message and str(path) not in exc.message, exc.message
            assert re.match(r"(frame \d+ of )?(instance -?\d+|an instance)\b", exc.message)
        except StudyError as exc:
            assert exc.message and exc.code
        else:
            fmt = header.frames[0].pixel
            assert loaded.volume.shape[1:] == (fmt.rows, fmt.columns)


def _expected(path: Path, air: float) -> np.ndarray:
    """pydicom's own decode, rescaled, padding as air — what our threads must reproduce."""
    ds = pydicom.dcmread(path)
    stored = ds.pixel_array.reshape(-1, ds.Rows, ds.Columns)
    values = stored * float(ds.get("RescaleSlope", 1)) + float(ds.get("RescaleIntercept", 0))
    if "PixelPaddingValue" in ds:
        values[stored == ds.PixelPaddingValue] = air
    return values


MONOCHROME = []
for _path in LOCAL_FILES:
    try:
        _ds = pydicom.dcmread(_path, stop_before_pixels=True)
        if _ds.get("SamplesPerPixel") == 1 and "Rows" in _ds and "NumberOfFrames" not in _ds:
            MONOCHROME.append(_path)
    except Exception:
        continue


@pytest.mark.parametrize("path", MONOCHROME, ids=lambda p: p.name)
def test_decode_matches_pydicom_for_each_transfer_syntax(path: Path, tmp_path: Path) -> None:
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    if "SeriesInstanceUID" not in ds:  # a bare codec sample: give it the UIDs it lacks
        path = _with_uids(path, tmp_path / path.name)
    try:
        (header,) = discover_series(path)
    except NotDicomError as exc:
        pytest.skip(f"not an image instance for ingest: {exc.message}")
    air = -1000.0 if header.modality == "CT" else 0.0
    with SourceReader() as reader:
        try:
            decoded = decode_stack(header.frames, reader, air=air, workers=2)
        except DecodeError as exc:
            assert UID(header.frames[0].pixel.transfer_syntax_uid).name in exc.message
            with pytest.raises(Exception):  # noqa: B017 - pydicom fails too: a real gap
                pydicom.dcmread(path).pixel_array  # noqa: B018
            return
    np.testing.assert_allclose(decoded, _expected(path, air), atol=1e-3)


def _with_uids(src: Path, dst: Path) -> Path:
    ds = pydicom.dcmread(src)
    ds.SOPClassUID = ds.file_meta.get("MediaStorageSOPClassUID") or SecondaryCaptureImageStorage
    ds.SOPInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    ds.save_as(dst)
    return dst


@pytest.mark.parametrize("name", MR_FAMILY)
def test_mr_small_variants_equal_the_uncompressed_reference(name: str) -> None:
    reference = pydicom.dcmread(_testdata("MR_small.dcm")).pixel_array
    loaded = load_series(discover_series(_testdata(name))[0])
    np.testing.assert_array_equal(loaded.volume.array[0], reference)
    assert loaded.volume.spacing[1:] == pytest.approx((0.3125, 0.3125))


@pytest.mark.parametrize("name", ["MR_small_expb.dcm", "MR_small_bigendian.dcm"])
def test_retired_big_endian_is_refused_with_the_rule(name: str) -> None:
    """Explicit VR Big Endian (retired in 2004) is refused at every door with one reason
    (radserve.ingest.rules, docs/conformance.md 1.1); pydicom's two Big Endian files were
    read here until session 15, while STOW-RS refused them."""
    reason = REFUSED_TRANSFER_SYNTAXES[ExplicitVRBigEndian]
    with pytest.raises(StudyError, match=re.escape(reason)):
        load_series(discover_series(_testdata(name))[0])


def test_truncated_pixel_data_names_the_instance() -> None:
    (header,) = discover_series(_testdata("MR_truncated.dcm"))
    uid = header.frames[0].sop_instance_uid
    with pytest.raises(
        DecodeError,
        match=rf"^(instance \d+|an instance) \(SOP Instance UID {re.escape(uid)}\): the file "
        "is truncated: Pixel Data declares 8192 bytes but only 8130 follow",
    ) as refused:
        load_series(header)
    assert "MR_truncated" not in refused.value.message


def test_missing_decoder_plugin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_decoder(RLELossless), "_available", {})
    (header,) = discover_series(_testdata("MR_small_RLE.dcm"))
    with pytest.raises(DecodeError, match=r"RLE Lossless.*no decoder plugin.*pylibjpeg-rle"):
        load_series(header)


def test_transfer_syntax_without_any_decoder(tmp_path: Path) -> None:
    ds = pydicom.dcmread(_testdata("MR_small.dcm"))
    ds.file_meta.TransferSyntaxUID = MPEG2MPML
    ds.PixelData = pydicom.encaps.encapsulate([ds.PixelData])
    ds.save_as(tmp_path / "mpeg.dcm")
    (header,) = discover_series(tmp_path)
    with pytest.raises(DecodeError, match="no pixel-data decoder exists for transfer syntax MPEG2"):
        load_series(header)


# --- synthetic series through every encoder available here ---------------------------------------
PYDICOM_SYNTAXES = [
    ImplicitVRLittleEndian,
    DeflatedExplicitVRLittleEndian,
    RLELossless,
    JPEGLSLossless,
    JPEG2000Lossless,
]


@pytest.mark.parametrize("syntax", PYDICOM_SYNTAXES, ids=lambda uid: UID(uid).name)
def test_synthetic_series_lossless(tmp_path: Path, syntax: str) -> None:
    hu = ramp_hu(3, 32, 36)
    try:
        make_ct_series(tmp_path, n_slices=3, rows=32, cols=36, hu=hu, transfer_syntax=syntax)
    except RuntimeError as exc:  # no encoder plugin installed here
        pytest.skip(f"cannot encode {UID(syntax).name}: {exc}")
    loaded = load_series(discover_series(tmp_path)[0], workers=2)
    np.testing.assert_array_equal(loaded.volume.array, hu)


def test_synthetic_series_jpeg2000_lossy(tmp_path: Path) -> None:
    hu = np.full((2, 32, 32), 40.0)
    try:
        make_ct_series(
            tmp_path,
            n_slices=2,
            rows=32,
            cols=32,
            hu=hu,
            transfer_syntax=JPEG2000,
            encode_options={"j2k_cr": [5]},
        )
    except RuntimeError as exc:
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")
    vol = load_series(discover_series(tmp_path)[0]).volume
    np.testing.assert_allclose(vol.array, hu, atol=3)


@pytest.mark.parametrize(
    ("syntax", "tolerance"),
    [
        ("jpeg-lossless-sv1", 0),
        ("jpeg-lossless", 0),
        ("jpeg-ls", 0),
        ("jpeg-ls-near", 2),
    ],
)
def test_synthetic_series_via_dcmtk(tmp_path: Path, syntax: str, tolerance: int) -> None:
    if shutil.which("dcmcjpeg") is None or shutil.which("dcmcjpls") is None:
        pytest.skip("dcmtk not installed")
    hu = ramp_hu(2, 16, 12) if tolerance < 10 else np.full((2, 16, 12), 40.0)
    (tmp_path / "enc").mkdir()
    for src in make_ct_series(tmp_path / "raw", n_slices=2, hu=hu):
        dcmtk_compress(src, tmp_path / "enc" / src.name, syntax)
    (header,) = discover_series(tmp_path / "enc")
    try:
        vol = load_series(header, workers=2).volume
    except DecodeError as exc:  # a decoder plugin is missing here: the message says which
        assert "decoders for this syntax" in exc.message or "Install" in exc.message
        pytest.skip(exc.message)
    np.testing.assert_allclose(vol.array, hu, atol=tolerance)


def test_jpeg_extended_is_refused_with_the_rule(tmp_path: Path) -> None:
    """JPEG Extended (12-bit CT in practice) is refused at every door with one reason
    (radserve.ingest.rules): no decoder radserve ships reads its 12-bit data."""
    if shutil.which("dcmcjpeg") is None:
        pytest.skip("dcmtk not installed")
    (tmp_path / "enc").mkdir()
    for src in make_ct_series(tmp_path / "raw", n_slices=2, hu=np.full((2, 16, 12), 40.0)):
        dcmtk_compress(src, tmp_path / "enc" / src.name, "jpeg-extended")
    reason = REFUSED_TRANSFER_SYNTAXES[JPEGExtended12Bit]
    with pytest.raises(StudyError, match=re.escape(reason)):
        load_series(discover_series(tmp_path / "enc")[0])
