"""Native pixel data read at the offset the header reader recorded (one header parse per
file instead of two) decodes to exactly what pydicom's general path gives."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian, JPEGLSLossless
from tests.factories.dicom_series import make_ct_series

from radserve.ingest import discover_series
from radserve.ingest.decode import decode_stack
from radserve.ingest.headers import FrameRef
from radserve.ingest.sources import SourceReader


def _both_ways(folder: Path) -> tuple[tuple[FrameRef, ...], np.ndarray, np.ndarray]:
    (header,) = discover_series(folder)
    frames = header.frames
    with SourceReader() as reader:
        fast = decode_stack(frames, reader, air=-1000.0, processes=False)
        general = decode_stack(
            [replace(f, pixel_offset=None) for f in frames], reader, air=-1000.0, processes=False
        )
    return frames, fast, general


def _rewrite(path: Path, bits_stored: int, photometric: str) -> None:
    """Garbage above Bits Stored (which pydicom masks, or sign-extends, when decoding)
    and the Photometric Interpretation asked for."""
    ds = pydicom.dcmread(path)
    stored = np.frombuffer(ds.PixelData, "<u2").copy()
    if bits_stored < 16:
        stored[::3] |= np.uint16((0xFFFF << bits_stored) & 0xFFFF)
        stored[1::3] &= np.uint16((1 << bits_stored) - 1)
    ds.PixelData = stored.tobytes()
    ds.PhotometricInterpretation = photometric
    ds.save_as(path)


@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ImplicitVRLittleEndian])
@pytest.mark.parametrize(
    ("bits_stored", "signed", "padding", "photometric"),
    [
        (12, False, None, "MONOCHROME2"),
        (12, True, None, "MONOCHROME2"),
        (16, True, -2000, "MONOCHROME2"),
        (16, False, None, "MONOCHROME1"),
    ],
)
def test_native_frames_read_at_the_recorded_offset_equal_pydicoms_decode(
    tmp_path: Path,
    syntax: str,
    bits_stored: int,
    signed: bool,
    padding: int | None,
    photometric: str,
) -> None:
    paths = make_ct_series(
        tmp_path,
        n_slices=4,
        rows=20,
        cols=13,  # odd: the value is padded to an even length
        transfer_syntax=syntax,
        bits_stored=bits_stored,
        signed=signed,
        rescale=(1.0, 0.0 if signed else -1024.0),
        pixel_padding_value=padding,
    )
    for path in paths:
        _rewrite(path, bits_stored, photometric)
    frames, fast, general = _both_ways(tmp_path)
    assert all(f.pixel_offset is not None for f in frames)
    assert {f.pixel.photometric_interpretation for f in frames} == {photometric}
    assert fast.dtype == general.dtype
    np.testing.assert_array_equal(fast, general)
    assert np.unique(general).size > 10  # real content, not a constant


def test_a_file_changed_after_its_header_was_read_is_read_the_general_way(
    tmp_path: Path,
) -> None:
    make_ct_series(tmp_path, n_slices=3, rows=8, cols=8)
    (header,) = discover_series(tmp_path)
    moved = [replace(f, pixel_offset=f.pixel_offset - 2) for f in header.frames]  # type: ignore[operator]
    with SourceReader() as reader:
        out = decode_stack(moved, reader, air=-1000.0, processes=False)
        general = decode_stack(
            [replace(f, pixel_offset=None) for f in header.frames], reader, air=-1000.0
        )
    np.testing.assert_array_equal(out, general)


def test_only_single_frame_native_files_get_an_offset(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=2, rows=32, cols=32, transfer_syntax=JPEGLSLossless)
    (header,) = discover_series(tmp_path)
    assert all(f.pixel_offset is None for f in header.frames)
