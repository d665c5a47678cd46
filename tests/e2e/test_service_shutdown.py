"""Issue 12, item 8: a clean stop (SIGTERM) of a real ``radserve serve`` leaves no
process behind: decode workers, multiprocessing's fork server and resource tracker
(~490 MB together) used to outlive it."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import psutil
import pytest
from pydicom.uid import JPEG2000Lossless
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

from radserve.host import usable_cores


@pytest.mark.slow
@pytest.mark.skipif(usable_cores() < 2, reason="one core: ingest decodes in-process")
def test_no_child_process_survives_sigterm(tmp_path: Path) -> None:
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
            # JPEG 2000 frames are decoded in worker processes
            files = make_study(tmp_path / "j2k", transfer_syntax=JPEG2000Lossless)
            r = c.post("/v1/studies", files=upload(files), headers=auth(key))
            assert r.status_code == 202, r.text
            assert wait_job(c, r.json()["id"], key)["state"] == "succeeded"
        children = psutil.Process(server.pid).children(recursive=True)
        names = [" ".join(p.cmdline()[:3]) for p in children]
        assert len(children) >= 2, names  # the fork server and at least one worker
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) in (0, -signal.SIGTERM)
        _, alive = psutil.wait_procs(children, timeout=30)
        survivors = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not survivors, [(p.pid, p.cmdline()) for p in survivors]
    finally:
        if server.poll() is None:
            server.kill()
    assert "service stopped" in log.read_text()
