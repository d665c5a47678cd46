"""Durability: ``kill -9`` a real ``radserve serve`` with jobs in flight, start it again,
and every acknowledged job completes with exactly one result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.service import (
    auth,
    config_file,
    make_models_slow,
    make_study,
    upload,
    wait_job,
)

from radserve.store import TERMINAL_STATES, init_store

N_JOBS = 10
# ~1 s of CPU per job with the slowed organ model, so jobs are caught mid-flight
GRID = {"n_slices": 24, "rows": 128, "cols": 128, "spacing": (2.0, 1.5, 1.5), "background": -100.0}


def _radserve(*args: str) -> list[str]:
    return [sys.executable, "-c", "from radserve.cli import main; main()", *args]


def _start(config: Path, data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = _radserve(
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--config",
        str(config),
        "--data-dir",
        str(data),
        "--cpu-workers",
        "1",
    )
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"radserve serve exited with {process.returncode}: {log.read_text()[-3000:]}"
            )
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("radserve serve did not answer /healthz within 90 s")


@pytest.mark.slow
def test_kill_9_with_jobs_in_flight_then_every_job_completes_once(tmp_path: Path) -> None:
    config, data, log = config_file(tmp_path), tmp_path / "data", tmp_path / "server.log"
    make_models_slow(tmp_path / "assets" / "models", layers=4, channels=32)
    created = subprocess.run(
        _radserve(
            "keys", "create", "--role", "submit", "--config", str(config), "--data-dir", str(data)
        ),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    key = created.stdout.strip().splitlines()[-1]
    studies = [make_study(tmp_path / f"study-{i}", **GRID) for i in range(N_JOBS)]
    port = free_port()
    server = _start(config, data, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            ids = []
            for files in studies:
                r = c.post("/v1/studies", files=upload(files), headers=auth(key))
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
        os.kill(server.pid, signal.SIGKILL)  # acknowledged: durable, whatever happens now
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()

    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        at_kill = {job_id: store.get_job(job_id).state for job_id in ids}
    finally:
        store.close()
    unfinished = [job_id for job_id, state in at_kill.items() if state not in TERMINAL_STATES]
    assert unfinished, f"every job finished before the kill: {at_kill}"

    server = _start(config, data, port, log)
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            jobs = {job_id: wait_job(c, job_id, key, timeout=120) for job_id in ids}
            for job in jobs.values():
                assert job["state"] == "succeeded", job
                report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key)).json()
                assert report["job_id"] == job["id"]
        server.send_signal(signal.SIGTERM)  # uvicorn stops, then re-raises the signal
        assert server.wait(60) in (0, -signal.SIGTERM)
        assert "service stopped" in log.read_text()
    finally:
        if server.poll() is None:
            server.kill()

    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        rows = {job_id: store.get_job(job_id) for job_id in ids}
        results = Counter(r.subject for r in store.iter_audit() if r.action == "job.succeeded")
        assert store.verify_audit().ok
    finally:
        store.close()
    for job_id, row in rows.items():
        assert row.result_path and Path(row.result_path, "report.json").is_file()
        assert Path(row.result_path).name == job_id
        assert results[job_id] == 1, f"job {job_id} has {results[job_id]} results"
        assert (
            row.attempts == (1 if at_kill[job_id] in ("queued", "received", "succeeded") else 2)
            or row.attempts <= 2
        )
    print(f"in flight at the kill: {len(unfinished)} of {N_JOBS} ({Counter(at_kill.values())})")
