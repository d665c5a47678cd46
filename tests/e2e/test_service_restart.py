"""Durability: ``kill -9`` a real ``radserve serve`` with jobs in flight, start it again,
and every acknowledged job completes with exactly one result."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import (
    auth,
    config_file,
    make_models_slow,
    make_study,
    upload,
    wait_job,
)

from radserve.config import load_settings
from radserve.store import TERMINAL_STATES, init_store
from radserve.store.audited import open_audited

N_JOBS = 10
# ~1 s of CPU per job with the slowed organ model, so jobs are caught mid-flight
GRID = {"n_slices": 24, "rows": 128, "cols": 128, "spacing": (2.0, 1.5, 1.5), "background": -100.0}


@pytest.mark.slow
def test_kill_9_with_jobs_in_flight_then_every_job_completes_once(tmp_path: Path) -> None:
    config, data, log = config_file(tmp_path), tmp_path / "data", tmp_path / "server.log"
    make_models_slow(tmp_path / "assets" / "models", layers=4, channels=32)
    key = create_key_cli(config, data)
    studies = [make_study(tmp_path / f"study-{i}", **GRID) for i in range(N_JOBS)]
    port = free_port()
    server = start_server(config, data, port, log)
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

    server = start_server(config, data, port, log)
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

    # the audit chain is keyed (HMAC): verify it with the server's key, as the CLI does
    store, _ = open_audited(load_settings(config, data_dir=data))
    try:
        rows = {job_id: store.get_job(job_id) for job_id in ids}
        audit = list(store.iter_audit())
        results = Counter(r.subject for r in audit if r.action == "job.succeeded")
        started = Counter(r.subject for r in audit if r.action == "job.started")
        requeued = {r.subject: r.payload for r in audit if r.action == "job.requeued"}
        assert store.verify_audit().ok
    finally:
        store.close()
    for job_id, row in rows.items():
        assert row.result_path and Path(row.result_path, "report.json").is_file()
        assert Path(row.result_path).name == job_id
        assert results[job_id] == 1, f"job {job_id} has {results[job_id]} results"
        # every run is audited (job.started per attempt), and so is the resumption
        assert started[job_id] == row.attempts, (job_id, started[job_id], row.attempts)
        if job_id in unfinished:
            assert requeued[job_id]["reason"] == "restart_recovery"
            assert requeued[job_id]["previous_state"] == at_kill[job_id]
        else:
            assert job_id not in requeued
        assert (
            row.attempts == (1 if at_kill[job_id] in ("queued", "received", "succeeded") else 2)
            or row.attempts <= 2
        )
    print(f"in flight at the kill: {len(unfinished)} of {N_JOBS} ({Counter(at_kill.values())})")
