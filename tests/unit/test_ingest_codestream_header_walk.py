"""The JPEG / JPEG-LS header walk refuses, before any decoder reads the frame, what made
GDCM end the process in tests/fuzz/codestream.py (2026-12-08): a libjpeg warning while
GDCM reads the header (a JFIF segment of another version, bytes between two segments) is
a C++ exception nobody catches (SIGABRT); a second frame header made its JPEG-LS codec
read past its buffer (SIGSEGV); preset coding parameters out of bounds ran it for ever.
Frames encoded by pyjpegls, dcmtk and Pillow still pass."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.encaps import generate_frames
from pydicom.uid import JPEGBaseline8Bit, JPEGLSLossless, JPEGLSNearLossless
from tests.factories.dicom_series import dcmtk_compress, make_ct_series

from radserve.ingest.codestream import frame_problem

ROWS, COLS = 16, 12


def _problem(syntax: str, frame: bytes, bits_allocated: int = 16) -> tuple[str, str] | None:
    return frame_problem(
        syntax,
        lambda at, size: frame[at : at + size],
        len(frame),
        rows=ROWS,
        columns=COLS,
        samples_per_pixel=1,
        bits_allocated=bits_allocated,
    )


def _frame_of(path: Path) -> bytes:
    ds = pydicom.dcmread(path)
    return bytes(next(generate_frames(ds.PixelData, number_of_frames=1)))


@pytest.fixture(scope="module")
def jpeg_ls(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A 12-bit JPEG-LS lossless frame (pyjpegls: no LSE segment)."""
    folder = tmp_path_factory.mktemp("jpeg-ls")
    paths = make_ct_series(folder, n_slices=1, rows=ROWS, cols=COLS, transfer_syntax=JPEGLSLossless)
    return _frame_of(paths[0])


@pytest.fixture(scope="module")
def baseline() -> bytes:
    """An 8-bit JPEG Baseline frame with its JFIF APP0 segment (Pillow)."""
    out = io.BytesIO()
    pixels = (np.arange(ROWS * COLS) % 256).astype(np.uint8).reshape(ROWS, COLS)
    Image.fromarray(pixels, mode="L").save(out, format="JPEG", quality=90)
    return out.getvalue()


def _before(frame: bytes, marker: bytes, insert: bytes) -> bytes:
    at = frame.index(marker)
    return frame[:at] + insert + frame[at:]


def _lse(maxval: int, t1: int = 0, t2: int = 0, t3: int = 0, reset: int = 0) -> bytes:
    return b"\xff\xf8\x00\x0d\x01" + struct.pack(">5H", maxval, t1, t2, t3, reset)


def _jfif_version(frame: bytes, major: int) -> bytes:
    at = frame.index(b"JFIF\x00") + 5
    return frame[:at] + bytes([major]) + frame[at + 1 :]


def _second_sof55(frame: bytes, columns: int) -> bytes:
    at = frame.index(b"\xff\xf7")
    sof = bytearray(frame[at : at + 13])
    sof[7:9] = struct.pack(">H", columns)
    return frame[: at + 13] + bytes(sof) + frame[at + 13 :]


def _near(frame: bytes, near: int) -> bytes:
    at = frame.index(b"\xff\xda") + 2 + 3 + 2  # Ls, Ns, one (Ci, Tmi)
    return frame[:at] + bytes([near]) + frame[at + 1 :]


BASELINE_CASES: list[tuple[str, Callable[[bytes], bytes], str]] = [
    ("JFIF 2.1 (SIGABRT)", lambda f: _jfif_version(f, 2), "JFIF segment gives version 2.1"),
    ("JFIF 0.1 (SIGABRT)", lambda f: _jfif_version(f, 0), "JFIF segment gives version 0.1"),
    (
        "two bytes before SOS (SIGABRT)",
        lambda f: _before(f, b"\xff\xda", b"\x00\x00"),
        "bytes that are no marker segment before its scan",
    ),
    (
        "a table cut to its length field (SIGABRT)",
        lambda f: _before(f, b"\xff\xc4", b"\xff\xc4\x00\x02\x00"),
        "bytes that are no marker segment before its scan",
    ),
    (
        "no scan after the frame header",
        lambda f: f[: f.index(b"\xff\xda")] + b"\xff\xd9",
        "no scan (SOS) after its frame header",
    ),
]
JPEG_LS_CASES: list[tuple[str, Callable[[bytes], bytes], str]] = [
    (
        "a second frame header of 0 columns (SIGSEGV)",
        lambda f: _second_sof55(f, 0),
        "more than one frame header",
    ),
    ("a second, equal frame header", lambda f: _second_sof55(f, COLS), "more than one frame"),
    (
        "MAXVAL beyond 12-bit samples (hang)",
        lambda f: _before(f, b"\xff\xda", _lse(65534)),
        "preset coding parameters (MAXVAL 65534",
    ),
    ("RESET 1", lambda f: _before(f, b"\xff\xda", _lse(0, reset=1)), "RESET 1)"),
    ("T2 under T1", lambda f: _before(f, b"\xff\xda", _lse(4095, 20, 10, 30)), "T1 20, T2 10"),
    ("T3 above MAXVAL", lambda f: _before(f, b"\xff\xda", _lse(1000, 3, 7, 1001)), "T3 1001"),
    ("NEAR above MAXVAL / 2", lambda f: _near(_before(f, b"\xff\xda", _lse(10)), 6), "NEAR 6"),
    (
        "an LSE of the wrong length",
        lambda f: _before(f, b"\xff\xda", b"\xff\xf8\x00\x0b\x01" + bytes(8)),
        "preset parameters segment (LSE) is damaged",
    ),
]


@pytest.mark.parametrize(
    ("edit", "match"), [c[1:] for c in BASELINE_CASES], ids=[c[0] for c in BASELINE_CASES]
)
def test_a_jpeg_header_gdcm_would_end_the_process_on_is_refused(
    baseline: bytes, edit: Callable[[bytes], bytes], match: str
) -> None:
    assert _problem(JPEGBaseline8Bit, baseline, bits_allocated=8) is None
    problem = _problem(JPEGBaseline8Bit, edit(baseline), bits_allocated=8)
    assert problem is not None and problem[0] == "decode_failed", problem
    assert match in problem[1], problem


@pytest.mark.parametrize(
    ("edit", "match"), [c[1:] for c in JPEG_LS_CASES], ids=[c[0] for c in JPEG_LS_CASES]
)
def test_a_jpeg_ls_header_gdcm_would_crash_or_hang_on_is_refused(
    jpeg_ls: bytes, edit: Callable[[bytes], bytes], match: str
) -> None:
    assert _problem(JPEGLSLossless, jpeg_ls) is None
    problem = _problem(JPEGLSLossless, edit(jpeg_ls))
    assert problem is not None and problem[0] == "decode_failed", problem
    assert match in problem[1], problem


def test_preset_parameters_within_bounds_pass(jpeg_ls: bytes) -> None:
    for lse in (_lse(0), _lse(4095, 3, 7, 21, 64), _lse(1000, 0, 0, 0, 255), _lse(4095, 18)):
        assert _problem(JPEGLSLossless, _before(jpeg_ls, b"\xff\xda", lse)) is None, lse


@pytest.mark.parametrize(
    ("name", "syntax"),
    [
        ("jpeg-ls", JPEGLSLossless),  # dcmcjpls writes an LSE segment
        ("jpeg-ls-near", JPEGLSNearLossless),
        ("jpeg-lossless", "1.2.840.10008.1.2.4.57"),
        ("jpeg-lossless-sv1", "1.2.840.10008.1.2.4.70"),
    ],
)
def test_frames_dcmtk_encodes_pass(tmp_path: Path, name: str, syntax: str) -> None:
    source = make_ct_series(tmp_path / "raw", n_slices=1, rows=ROWS, cols=COLS)[0]
    try:
        encoded = dcmtk_compress(source, tmp_path / f"{name}.dcm", name)
    except FileNotFoundError:
        pytest.skip("dcmtk is not installed")
    assert pydicom.dcmread(encoded).file_meta.TransferSyntaxUID == syntax
    assert _problem(syntax, _frame_of(encoded)) is None
