"""JPEG 2000 frames decoded in worker processes: the same volume as threads, clear errors.

pylibjpeg-openjpeg holds the GIL, so ``decode_stack`` hands these syntaxes to processes;
the volume must not depend on where a frame was decoded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless
from tests.factories.dicom_series import make_ct_series, make_enhanced_series, ramp_hu, truncate

from radserve.errors import DecodeError
from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.ingest.decode import (
    decode_stack,
    shutdown_decode_workers,
    start_decode_workers,
    use_processes,
)
from radserve.ingest.geometry import plan_stack
from radserve.ingest.headers import FrameRef
from radserve.ingest.sources import SourceReader

N = 12  # more than the minimum that goes to processes


@pytest.fixture(scope="module", autouse=True)
def _stop_workers() -> Iterator[None]:
    yield
    shutdown_decode_workers()


def _series(folder: Path, syntax: str = JPEG2000Lossless, **kwargs: object) -> list[Path]:
    try:
        return make_ct_series(
            folder, n_slices=N, rows=40, cols=36, transfer_syntax=syntax, **kwargs
        )
    except RuntimeError as exc:  # no JPEG 2000 encoder installed here
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")


def _ordered(folder: Path) -> list[FrameRef]:
    header = discover_series(folder)[0]
    layout = plan_stack(header.frames, IngestPolicy())
    return [header.frames[i] for i in layout.order]


def _decode(frames: list[FrameRef], **kwargs: object) -> np.ndarray:
    with SourceReader() as reader:
        return decode_stack(frames, reader, air=-1000.0, **kwargs)  # type: ignore[arg-type]


def test_processes_threads_and_one_thread_give_the_same_volume(tmp_path: Path) -> None:
    hu = ramp_hu(N, 40, 36)
    _series(tmp_path, hu=hu, order="shuffled")
    frames = _ordered(tmp_path)
    in_processes = _decode(frames, processes=True, workers=2)
    np.testing.assert_array_equal(in_processes, _decode(frames, processes=False, workers=2))
    np.testing.assert_array_equal(in_processes, _decode(frames, processes=False, workers=1))
    np.testing.assert_array_equal(in_processes, hu)
    assert in_processes.dtype == np.int16
    # And load_series picks processes by itself for this syntax.
    np.testing.assert_array_equal(load_series(discover_series(tmp_path)[0]).volume.array, hu)


def test_processes_are_chosen_for_jpeg2000_only(tmp_path: Path) -> None:
    _series(tmp_path / "j2k")
    make_ct_series(tmp_path / "raw", n_slices=N, rows=40, cols=36)
    j2k, raw = _ordered(tmp_path / "j2k"), _ordered(tmp_path / "raw")
    assert raw[0].pixel.transfer_syntax_uid == ExplicitVRLittleEndian
    assert use_processes(j2k, workers=2)
    # one core, or a few frames: still processes (a damaged codestream can abort the
    # decoder's process: a 3-frame study took the server down in its threads)
    assert use_processes(j2k, workers=1)
    assert use_processes(j2k[:1], workers=2)
    assert not use_processes(raw, workers=2)  # uncompressed decoders release the GIL


def test_multiframe_jpeg2000_in_processes(tmp_path: Path) -> None:
    hu = ramp_hu(N, 40, 36)
    try:
        make_enhanced_series(
            tmp_path,
            n_frames=N,
            rows=40,
            cols=36,
            hu=hu,
            frame_order="shuffled",
            transfer_syntax=JPEG2000Lossless,
        )
    except RuntimeError as exc:
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")
    frames = _ordered(tmp_path)
    in_processes = _decode(frames, processes=True, workers=3)
    np.testing.assert_array_equal(in_processes, _decode(frames, processes=False))
    np.testing.assert_array_equal(in_processes, hu)


def test_values_beyond_int16_fall_back_to_float32_in_processes(tmp_path: Path) -> None:
    hu = np.full((N, 40, 36), 32000.0)
    hu[:, :5] = 33500.0  # past int16 after the integral rescale
    _series(tmp_path, hu=hu, rescale=(1.0, 30000.0))
    frames = _ordered(tmp_path)
    in_processes = _decode(frames, processes=True, workers=2)
    assert in_processes.dtype == np.float32
    np.testing.assert_array_equal(in_processes, _decode(frames, processes=False))
    np.testing.assert_array_equal(in_processes, hu)


def test_a_damaged_file_in_a_worker_is_named_and_the_workers_carry_on(tmp_path: Path) -> None:
    paths = _series(tmp_path)
    frames = _ordered(tmp_path)
    bad = sorted(paths)[7]
    uid = pydicom.dcmread(bad, stop_before_pixels=True).SOPInstanceUID
    truncate(bad, keep_fraction=0.7)
    # Named by Instance Number and UID, in one line; never by its file, whose name and
    # folders are the sender's (a PACS export names them by patient)
    with pytest.raises(
        DecodeError,
        match=rf"instance 8 \(SOP Instance UID {uid}\): the pixel data \(JPEG 2000 .*damaged",
    ) as err:
        _decode(frames, processes=True, workers=2)
    assert bad.name not in str(err.value) and "\n" not in str(err.value)
    # The pool survived the error: other studies still decode.
    _series(tmp_path / "next", hu=ramp_hu(N, 40, 36))
    np.testing.assert_array_equal(
        _decode(_ordered(tmp_path / "next"), processes=True, workers=2), ramp_hu(N, 40, 36)
    )


def test_workers_can_be_started_ahead_of_the_first_study() -> None:
    shutdown_decode_workers()  # a running pool is never resized: another test's may be 1
    assert start_decode_workers(2) == 2


def test_jpeg2000_prefers_pylibjpeg_and_falls_back_to_any_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydicom.pixels import get_decoder

    from radserve.ingest import decode

    if "pylibjpeg" in get_decoder(JPEG2000Lossless).available_plugins:
        assert decode.preferred_plugin(JPEG2000Lossless) == "pylibjpeg"
    assert decode.preferred_plugin(ExplicitVRLittleEndian) == ""
    hu = ramp_hu(N, 40, 36)
    _series(tmp_path, hu=hu)
    monkeypatch.setattr(decode, "preferred_plugin", lambda uid: "no-such-plugin")
    np.testing.assert_array_equal(_decode(_ordered(tmp_path), processes=False), hu)


@pytest.mark.parametrize("stored_dtype", [np.uint16, np.int16])
def test_direct_rescale_equals_the_general_one(stored_dtype) -> None:
    """Slope 1 without padding goes straight into the int16 volume; with padding (the
    general path) the same values come out, and out-of-range values still ask for
    float32 rather than wrap."""
    import dataclasses

    from radserve.ingest import decode
    from radserve.ingest.headers import PixelFormat
    from radserve.ingest.sources import SourceFile

    rng = np.random.default_rng(1)
    stored = rng.integers(0, 3000, (6, 7)).astype(stored_dtype)
    fmt = PixelFormat(ExplicitVRLittleEndian, 6, 7, 1, "MONOCHROME2", 16, 16, 0)
    frame = FrameRef(SourceFile(Path("x.dcm")), None, "1.2", "1.2.3", fmt, rescale_intercept=-1024)
    padded = dataclasses.replace(frame, pixel=dataclasses.replace(fmt, padding=(65000, 65000)))
    direct, general = np.zeros((1, 6, 7), np.int16), np.zeros((1, 6, 7), np.int16)
    decode._store(direct, 0, stored, frame, air=-1000.0)
    decode._store(general, 0, stored, padded, air=-1000.0)
    np.testing.assert_array_equal(direct[0], stored.astype(np.int32) - 1024)
    np.testing.assert_array_equal(direct, general)
    high = dataclasses.replace(frame, rescale_intercept=32000)
    with pytest.raises(decode._NeedFloat):
        decode._store(direct, 0, stored, high, air=-1000.0)


def test_jpeg_lossless_is_decoded_in_the_processes_whose_stderr_is_relayed(
    tmp_path: Path,
) -> None:
    """GDCM's libjpeg writes "Bogus marker length" on its process's stderr for a damaged
    JPEG Lossless fragment: in the server that was a plain line among the JSON log, so
    these syntaxes always go to the decoding processes (their stderr is relayed as log
    records, tests/unit/test_worker_stderr.py), one frame and one core included."""
    import subprocess

    from tests.factories.dicom_net import dcmtk_tool

    from radserve.ingest.decode import STDERR_SYNTAXES

    tool = dcmtk_tool("dcmcjpeg")
    if tool is None:
        pytest.skip("dcmtk's dcmcjpeg is not installed")
    raw = make_ct_series(tmp_path / "raw", n_slices=3, rows=40, cols=36, hu=ramp_hu(3, 40, 36))
    (tmp_path / "jpeg").mkdir()
    for path in raw:  # dcmcjpeg's default: JPEG Lossless, selection value 1
        subprocess.run([tool, str(path), str(tmp_path / "jpeg" / path.name)], check=True)
    jpeg = _ordered(tmp_path / "jpeg")
    assert jpeg[0].pixel.transfer_syntax_uid in STDERR_SYNTAXES
    assert use_processes(jpeg[:1], workers=1)
    assert np.array_equal(_decode(jpeg), _decode(_ordered(tmp_path / "raw"), processes=False))


def test_a_decoder_that_aborts_on_a_small_jpeg2000_stack_takes_down_a_worker_only(
    tmp_path: Path,
) -> None:
    """Found by tools/edge_probe.py's variant cut to 3 slices: random bytes after a JPEG
    2000 codestream's start make its decoder throw a C++ exception nobody catches
    (abort). Under 8 frames the stack was decoded in the calling process's threads: the
    server died. It is a worker now, and the study fails with decode_failed. Since
    2026-12-07 the header reader refuses such frames first (their SIZ marker segment is
    damaged: radserve.ingest.codestream), so the decoder is called here directly."""
    import random

    from pydicom.encaps import encapsulate

    for k, path in enumerate(_series(tmp_path / "j2k")[:3]):
        ds = pydicom.dcmread(path)
        rng = random.Random(k)
        ds.PixelData = encapsulate([b"\xff\x4f\xff\x51" + rng.randbytes(600)])
        ds["PixelData"].VR = "OB"
        ds.save_as(path)
    for path in sorted((tmp_path / "j2k").iterdir())[3:]:
        path.unlink()
    header = discover_series(tmp_path / "j2k")[0]
    assert len(header.frames) == 3 and use_processes(header.frames)
    assert all("SIZ marker segment is damaged" in f.problem.text for f in header.frames)
    with pytest.raises(DecodeError), SourceReader() as reader:
        decode_stack(header.frames, reader, air=-1024.0)
    with pytest.raises(DecodeError, match="SIZ marker segment is damaged"):
        load_series(header)
