"""Issue 15: ``radserve serve`` with ``executor: ray`` against a two-"host" Ray cluster.

The Ray head listens on one end of a veth pair in this network namespace, a Ray worker
node joins it from a network namespace of its own over the link (10.213.x.y/30, nothing
leaves the machine: see tests/factories/netns_ray.py). The server's only device worker
is placed on the namespace's node through its custom resource (``cpu:1@...``), so every
batch crosses the link through Ray's object store both ways. Checked: the worker actor
runs inside the namespace (its pid is one of the namespace's processes, its node address
the namespace's), the study's batches ran on it, the job succeeds and has exactly one
result. The namespace is always torn down.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.netns_ray import RESOURCE, TwoHostRay
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

from radserve.config import SQLITE_FILE_NAME

pytest.importorskip("ray", reason="the ray extra is not installed")

STARTED = re.compile(r"ray-cpu0 \([^,]+, node (?P<ip>[\d.]+), pid (?P<pid>\d+)\)")


@pytest.mark.slow
def test_a_study_runs_on_a_worker_node_in_another_network_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = make_study(tmp_path / "study")
    with TwoHostRay() as cluster:
        for name, value in cluster.env.items():  # the server joins with the cluster's token
            monkeypatch.setenv(name, value)
        config = config_file(
            tmp_path,
            executor="ray",
            ray={
                "address": cluster.address,
                "devices": [f"cpu:1@{RESOURCE}"],
                "startup_timeout_s": 120,
            },
        )
        data, log, port = tmp_path / "data", tmp_path / "serve.log", free_port()
        key = create_key_cli(config, data)
        server = start_server(config, data, port, log)
        try:
            started = [
                json.loads(line)["msg"]
                for line in log.read_text().splitlines()
                if "Ray executor started" in line
            ]
            assert len(started) == 1, log.read_text()[-3000:]
            where = STARTED.search(started[0])
            assert where is not None, started[0]
            assert where["ip"] == cluster.node_ip
            assert int(where["pid"]) in cluster.netns_pids()
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                r = client.post("/v1/studies", files=upload(study), headers=auth(key))
                assert r.status_code == 202, r.text
                job_id = r.json()["id"]
                job = wait_job(client, job_id, key, timeout=240)
                assert job["state"] == "succeeded", job
                report = client.get(f"/v1/jobs/{job_id}/report", headers=auth(key))
                assert report.status_code == 200 and report.json()["findings"]
                metrics = client.get("/metrics", headers=auth(key)).text
            batches = re.findall(
                r'radserve_batch_seconds_count\{[^}]*device="ray-cpu0"[^}]*\} (\S+)', metrics
            )
            assert batches and sum(float(b) for b in batches) >= 1, metrics[-2000:]
            assert not re.search(r'radserve_batch_seconds_count\{[^}]*device="(?!ray-)', metrics)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    with sqlite3.connect(data / SQLITE_FILE_NAME) as db:
        succeeded = db.execute(
            "SELECT subject, count(*) FROM audit_records WHERE action = 'job.succeeded' "
            "GROUP BY subject"
        ).fetchall()
    assert succeeded == [(job_id, 1)]
    assert not Path(f"/run/netns/{cluster.netns}").exists()
