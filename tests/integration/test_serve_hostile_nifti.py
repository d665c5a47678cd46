"""NIfTI uploads whose header is damaged, sent to a real ``radserve serve``
(``POST /v1/studies``, field ``files``): each fails its own job with a code and a
message naming the field, and the server takes the next study.

Before the 2026-12 fuzzing of the NIfTI door (tests/fuzz/targets/nifti.py): a NaN
pixdim beside a valid sform failed its job as ``internal_error`` (a ``LinAlgError``
comparing the qform with the sform); a ``.nii`` whose vox_offset is 0 succeeded, its
348 header bytes read as the first voxels; a ``.nii.gz`` inflating 512 MiB past its
voxels was refused, as it still is, having inflated one byte more than it declares."""

from __future__ import annotations

import gzip
import signal
import zlib
from pathlib import Path

import httpx
import nibabel as nib
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, wait_job

from radserve.ingest import discover_series, load_series, save_nifti

pytestmark = [pytest.mark.slow]


def _nii(tmp_path: Path) -> bytes:
    """The bytes of a ``.nii`` of the test study the pipeline runs on."""
    volume = load_series(discover_series(make_study(tmp_path / "study"))[0]).volume
    return save_nifti(volume, tmp_path / "ct.nii").read_bytes()


def _edited(raw: bytes, **fields: object) -> bytes:
    header = nib.Nifti1Header(bytearray(raw[:348]), check=False)
    for name, value in fields.items():
        if name == "pixdim3":
            pixdim = header["pixdim"].copy()
            pixdim[3] = value
            header["pixdim"] = pixdim
        else:
            header[name] = value
    return header.binaryblock + raw[348:]


def _bomb(raw: bytes) -> bytes:
    """``raw`` gzip-compressed and followed, in the same stream, by 512 MiB of zeros."""
    stream = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts = [stream.compress(raw)] + [stream.compress(bytes(2**20)) for _ in range(512)]
    return b"".join([*parts, stream.flush()])


def test_damaged_nifti_headers_fail_their_own_job_naming_the_field(tmp_path: Path) -> None:
    config, data, log = config_file(tmp_path), tmp_path / "data", tmp_path / "server.log"
    key = create_key_cli(config, data)
    raw = _nii(tmp_path)
    cases = {
        "pixdim-nan.nii.gz": (
            gzip.compress(_edited(raw, pixdim3=float("nan"))),
            "nifti_invalid",
            "pixdim[3] is nan: the qform's voxel sizes must be finite numbers",
        ),
        "offset-0.nii": (
            _edited(raw, vox_offset=0),
            "nifti_invalid",
            "the NIfTI header's vox_offset is 0: the voxels of a single-file NIfTI",
        ),
        "bomb.nii.gz": (
            _bomb(raw),
            "nifti_invalid",
            f"gzip stream inflates beyond the {len(raw)} bytes its header declares",
        ),
    }
    port = free_port()
    server = start_server(config, data, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            for name, (content, code, said) in cases.items():
                r = c.post(
                    "/v1/studies",
                    files=[("files", (name, content, "application/octet-stream"))],
                    headers=auth(key),
                )
                assert r.status_code == 202, r.text
                job = wait_job(c, r.json()["id"], key, timeout=120)
                assert job["state"] == "failed", (name, job)
                assert job["error"]["code"] == code, (name, job)
                assert said in job["error"]["message"], (name, job)
                assert job["attempts"] == 1, (name, job)
            good = c.post(
                "/v1/studies",
                files=[("files", ("ct.nii.gz", gzip.compress(raw), "application/gzip"))],
                headers=auth(key),
            )
            assert good.status_code == 202, good.text
            assert wait_job(c, good.json()["id"], key, timeout=120)["state"] == "succeeded"
        assert server.poll() is None
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    assert not [line for line in log.read_text().splitlines() if "Traceback" in line]
