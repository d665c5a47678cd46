"""``radserve serve`` with ``executor: ray`` and a local Ray, as a real process left idle.

A local Ray's raylet and GCS die with the *thread* that started them (Linux's
parent-death signal is per thread). The service used to call ``ray.init`` from the API's
thread pool (whose idle threads exit after 10 s) or a short-lived starter thread, so a
server left without requests lost its raylet seconds after start and exited with 1. The
in-process tests never saw it: they start Ray on the main thread themselves, and their
polling kept the pool thread busy."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.waits import until

pytest.importorskip("ray", reason="the ray extra is not installed")

# longer than the thread pool's idle timeout (10 s) and Ray's start-up after it
IDLE_S = 25


@pytest.mark.slow
def test_an_idle_ray_server_keeps_its_cluster_and_still_runs_studies(tmp_path: Path) -> None:
    config = config_file(
        tmp_path,
        executor="ray",
        ray={"address": "local", "num_cpus": 2, "object_store_mb": 128},
    )
    data, log = tmp_path / "data", tmp_path / "server.log"
    key = create_key_cli(config, data)
    study = make_study(tmp_path / "study", n_slices=12, rows=64, cols=64)
    port = free_port()
    # a RAY_ADDRESS in the environment (or the host's last `ray start --head`) made
    # address: local join that cluster, and refuse num_cpus there (exit 3; session 43)
    server = start_server(config, data, port, log, env={"RAY_ADDRESS": f"127.0.0.1:{free_port()}"})
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as c:

            def ready() -> bool:
                assert server.poll() is None, log.read_text()[-3000:]
                return c.get("/readyz", headers=auth(key)).status_code == 200

            until(ready, "the server to be ready", 180, step=0.5)
        # no request at all meanwhile: the pool's threads go idle and exit
        time.sleep(IDLE_S)
        assert server.poll() is None, f"exited {server.returncode}: {log.read_text()[-3000:]}"
        with httpx.Client(base_url=url, timeout=60) as c:
            submitted = c.post("/v1/studies", files=upload(study), headers=auth(key))
            assert submitted.status_code == 202, submitted.text
            job = wait_job(c, submitted.json()["id"], key, timeout=180)
            assert job["state"] == "succeeded", job
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, log.read_text()[-3000:]
        assert "service stopped" in log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
