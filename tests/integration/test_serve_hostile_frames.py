"""Compressed frames that are not what their header says, uploaded to a real ``radserve
serve`` (``POST /v1/studies``; the header reader behind it is every door's): before
2026-12-07 a JPEG-LS slice whose frame declares fewer pixels than Rows x Columns killed
the server (GDCM threw a C++ exception nobody catches: SIGABRT, and the job resumed at
the next start), and an RLE slice whose segments decode past Rows x Columns left its job
running for ever, every later job queued behind it (a Rust panic, a BaseException,
ended the scheduler's worker thread). Each must now fail its own job with a named
reason, and the server take the next study (docs/hostile-input.md, "Frames, tables and
bombs")."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pydicom
import pytest
from pydicom.encaps import encapsulate, generate_frames
from pydicom.uid import JPEGLSLossless, RLELossless
from tests.factories.dicom_net import free_port
from tests.factories.dicom_series import make_ct_series
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

pytestmark = [pytest.mark.slow]


def _with_frame_of(study: list[Path], slot: int, syntax: str, rows: int, cols: int) -> None:
    """Slice ``slot`` of ``study`` (40 x 40) given the frame of a ``rows`` x ``cols``
    image in ``syntax``, its header unchanged."""
    source = make_ct_series(
        study[0].parent / "frame", n_slices=1, rows=rows, cols=cols, transfer_syntax=syntax
    )[0]
    frame = next(generate_frames(pydicom.dcmread(source).PixelData, number_of_frames=1))
    source.unlink()
    source.parent.rmdir()
    ds = pydicom.dcmread(study[slot])
    ds.file_meta.TransferSyntaxUID = syntax
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.save_as(study[slot], enforce_file_format=True)


def test_frames_unlike_their_header_fail_their_own_job_and_the_server_goes_on(
    tmp_path: Path,
) -> None:
    config, data, log = config_file(tmp_path), tmp_path / "data", tmp_path / "server.log"
    key = create_key_cli(config, data)
    jpeg_ls = make_study(tmp_path / "jpeg-ls")
    _with_frame_of(jpeg_ls, 5, JPEGLSLossless, 20, 18)  # fewer pixels than 40 x 40
    rle = make_study(tmp_path / "rle")
    _with_frame_of(rle, 5, RLELossless, 64, 64)  # segments that decode past 40 x 40
    port = free_port()
    server = start_server(config, data, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            answers = {}
            for name, files in (("jpeg-ls", jpeg_ls), ("rle", rle)):
                r = c.post("/v1/studies", files=upload(files), headers=auth(key))
                assert r.status_code == 202, r.text
                answers[name] = wait_job(c, r.json()["id"], key, timeout=120)
            assert answers["jpeg-ls"]["state"] == "failed", answers["jpeg-ls"]
            assert answers["jpeg-ls"]["error"]["code"] == "instance_invalid"
            assert (
                "its JPEG-LS codestream declares 20 × 18 pixels of 1 component(s)"
                in answers["jpeg-ls"]["error"]["message"]
            )
            assert answers["rle"]["state"] == "failed", answers["rle"]
            assert answers["rle"]["error"]["code"] == "decode_failed"
            assert (
                "the pixel data (RLE Lossless) could not be decoded"
                in (answers["rle"]["error"]["message"])
            )
            good = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "good")), headers=auth(key)
            )
            assert wait_job(c, good.json()["id"], key, timeout=120)["state"] == "succeeded"
        assert server.poll() is None
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    lines = log.read_text().splitlines()
    assert not [x for x in lines if "Traceback" in x]
    for line in lines:  # the decoder's panic, relayed from its process as a record
        json.loads(line)
