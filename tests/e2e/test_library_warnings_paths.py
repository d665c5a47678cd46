"""pydicom's warnings reach the terminal and the server log only through radserve's
redacting logger, on every path that reads DICOM (issue 12, item 13): the header reader
in the serving process and the pixel decoders in the decode worker processes (JPEG 2000
is decoded there). Before, a worker (forkserver: Python's default warning display)
printed ``.../valuerep.py:440: UserWarning: Invalid value for VR IS: '1.0'`` and the
source line as two plain lines on the inherited stderr, in ``radserve run`` and in
``radserve serve``'s JSON log alike.

The studies: one with Number of Frames ``1.0`` (an IS that pydicom warns about while
decoding, in a worker), one whose file meta says Explicit VR but whose data set is
Implicit VR ("Expected explicit VR, but found implicit VR"), with a patient name in a UID
element ("Invalid value for VR UI"). The second also used to fail: Pixel Data's length
was read as if Explicit VR ("Pixel Data holds 0 bytes"); both now run.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import warnings
from pathlib import Path

import httpx
import pydicom
import pytest
from pydicom.uid import JPEG2000Lossless
from tests.factories.dicom_net import free_port
from tests.factories.hostile import set_raw
from tests.factories.server_process import create_key_cli, radserve_command, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

from radserve.host import usable_cores

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(usable_cores() < 2, reason="one core: ingest decodes in-process"),
]
NAME = "Doe^Jonathan"
# Python's own warning display: "<file>.py:<line>: <Category>Warning: <message>"
PLAIN_WARNING = re.compile(r"^\S*\.py:\d+: \w*Warning: |^\s+warn_and_log\(", re.MULTILINE)


def _worker_warning_study(folder: Path) -> Path:
    """JPEG 2000 (decoded in worker processes), Number of Frames written as '1.0'."""
    files = make_study(folder, transfer_syntax=JPEG2000Lossless)
    assert len(files) >= 8  # enough frames for process decoding (decode._MIN_PROCESS_FRAMES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in files:
            ds = pydicom.dcmread(path)
            set_raw(ds, "NumberOfFrames", b"1.0")
            ds.save_as(path, enforce_file_format=False)
    return folder


def _implicit_study(folder: Path) -> Path:
    """Meta: Explicit VR Little Endian; data set: Implicit VR; a name in a UID element."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in make_study(folder):
            ds = pydicom.dcmread(path)
            set_raw(ds, "FrameOfReferenceUID", f"1.2.{NAME}".encode())
            pydicom.dcmwrite(path, ds, implicit_vr=True, little_endian=True, force_encoding=True)
    return folder


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("warning-studies")
    return {
        "worker": _worker_warning_study(root / "worker"),
        "implicit": _implicit_study(root / "implicit"),
    }


@pytest.mark.parametrize(
    ("study", "warned"),
    [
        ("worker", "Invalid value for VR IS"),
        ("implicit", "Expected explicit VR, but found implicit VR"),
    ],
)
def test_radserve_run_shows_library_warnings_as_log_lines(
    studies: dict[str, Path], tmp_path: Path, study: str, warned: str
) -> None:
    config = config_file(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        radserve_command("run", str(studies[study]), "--config", str(config), "--out", str(out)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "report.json").is_file()
    assert not PLAIN_WARNING.search(done.stderr), done.stderr[-3000:]
    assert re.search(rf"WARNING (pydicom|py\.warnings): .*{warned}", done.stderr), done.stderr
    assert "Doe" not in done.stdout + done.stderr


def test_radserve_serve_logs_worker_warnings_as_json(
    studies: dict[str, Path], tmp_path: Path
) -> None:
    config, data, log, port = (
        config_file(tmp_path),
        tmp_path / "data",
        tmp_path / "server.log",
        free_port(),
    )
    key = create_key_cli(config, data)
    server = start_server(config, data, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            for name, folder in studies.items():
                files = sorted(folder.iterdir())
                r = c.post("/v1/studies", files=upload(files), headers=auth(key))
                assert r.status_code == 202, r.text
                job = wait_job(c, r.json()["id"], key, timeout=120)
                assert job["state"] == "succeeded", (name, job)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    text = log.read_text()
    assert not PLAIN_WARNING.search(text), text[-3000:]
    assert "Doe" not in text
    records = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    library = " ".join(r["msg"] for r in records if r["logger"] in ("pydicom", "py.warnings"))
    for warned in (
        "Invalid value for VR IS",
        "Expected explicit VR, but found implicit VR",
        "Invalid value for VR UI: '<redacted>'",
    ):
        assert warned in library, library
