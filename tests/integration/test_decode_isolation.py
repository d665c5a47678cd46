"""JPEG Baseline and JPEG-LS frames are decoded in the decoding processes since
2026-12-08: GDCM, pydicom's first plugin for both, ended its process on damaged headers
that tests/fuzz/codestream.py found (a JFIF segment of version 255 in a JPEG Baseline
frame: a libjpeg warning that GDCM turns into a C++ exception nobody catches, SIGABRT).
The header reader now refuses those frames, so here ``decode_stack`` is given one
directly, as it would be given damage the header reader cannot see: the decoding
process dies, the stack fails with a DecodeError that says so, and the next study
decodes. Before, the caller's threads decoded it and the caller died (the server).

The scenario runs in a child interpreter, so that a regression fails this test with the
signal instead of ending the test session."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.encaps import encapsulate, generate_frames
from pydicom.uid import JPEGLSLossless, JPEGLSNearLossless
from tests.factories.child_python import how_it_ended, run_python
from tests.factories.dicom_series import as_jpeg_baseline, make_ct_series

from radserve.errors import DecodeError
from radserve.ingest import discover_series
from radserve.ingest.decode import decode_stack, shutdown_decode_workers, use_processes
from radserve.ingest.sources import SourceReader

_MODULE = "tests.integration.test_decode_isolation"  # as the child imports it
ROWS, COLS = 16, 12


def _baseline_series(folder: Path) -> list[Path]:
    paths = make_ct_series(folder, n_slices=3, rows=ROWS, cols=COLS)
    as_jpeg_baseline(paths, quality=90)
    return paths


def _jfif_version_255(path: Path) -> None:
    """The slice's frame with its JFIF major version set to 255 (GDCM: SIGABRT)."""
    ds = pydicom.dcmread(path)
    frame = bytearray(next(generate_frames(ds.PixelData, number_of_frames=1)))
    frame[frame.index(b"JFIF\x00") + 5] = 255
    ds.PixelData = encapsulate([bytes(frame)])
    ds.save_as(path)


def _pillow_decoded(paths: list[Path]) -> np.ndarray:
    """What the slices hold, decoded by Pillow here (stored values x Rescale Slope 16 +
    Rescale Intercept -1024, as as_jpeg_baseline writes them)."""
    stored = []
    for path in paths:
        frame = next(generate_frames(pydicom.dcmread(path).PixelData, number_of_frames=1))
        stored.append(np.asarray(Image.open(io.BytesIO(frame))).astype(np.int32))
    return (np.stack(stored) * 16 - 1024).astype(np.int16)


def scenario(work: str) -> None:
    """In the child: a damaged stack fails with a DecodeError, the next one decodes."""
    folder = Path(work)
    damaged = _baseline_series(folder / "damaged")
    _jfif_version_255(damaged[1])
    header = discover_series(folder / "damaged")[0]
    odd = [f for f in header.frames if f.problem is not None]
    assert len(odd) == 1 and "JFIF segment gives version 255" in odd[0].problem.text
    assert use_processes(header.frames)
    try:
        with (
            pytest.raises(DecodeError, match="a pixel-data decoding process died"),
            SourceReader() as reader,
        ):
            decode_stack(header.frames, reader, air=-1024.0, workers=2)
        good = _baseline_series(folder / "good")
        frames = sorted(discover_series(folder / "good")[0].frames, key=lambda f: f.source.path)
        with SourceReader() as reader:
            volume = decode_stack(frames, reader, air=-1024.0, workers=2)
        np.testing.assert_array_equal(volume, _pillow_decoded(sorted(good)))
    finally:
        shutdown_decode_workers(helpers=True)
    print("isolated", flush=True)


def test_a_jpeg_baseline_frame_that_aborts_gdcm_fails_its_stack_and_the_next_decodes(
    tmp_path: Path,
) -> None:
    code = f"from {_MODULE} import scenario; scenario({str(tmp_path)!r})"
    done = run_python(["-c", code], timeout_s=300)
    ended = how_it_ended(done)
    assert done.returncode == 0, f"the decoding caller ended by {ended}:\n{done.stderr[-4000:]}"
    assert done.stdout.strip().endswith("isolated"), done.stdout


@pytest.mark.parametrize("syntax", [JPEGLSLossless, JPEGLSNearLossless])
def test_jpeg_ls_is_decoded_in_the_processes(tmp_path: Path, syntax: str) -> None:
    options = {"jls_error": 2} if syntax == JPEGLSNearLossless else {}
    make_ct_series(
        tmp_path, n_slices=2, rows=ROWS, cols=COLS, transfer_syntax=syntax, encode_options=options
    )
    frames = discover_series(tmp_path)[0].frames
    assert use_processes(frames[:1], workers=1)
    try:
        with SourceReader() as reader:
            in_processes = decode_stack(frames, reader, air=-1024.0, workers=2)
            in_threads = decode_stack(frames, reader, air=-1024.0, processes=False)
    finally:
        shutdown_decode_workers()
    np.testing.assert_array_equal(in_processes, in_threads)
