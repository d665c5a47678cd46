"""A second ``radserve serve`` on the SQLite data dir of a running one (real processes):
it refuses at once with one line naming the data dir and the running server's pid, exit
2, and claims none of the store's jobs. Before, it started on another port, claimed
every unfinished job ("leases: 4 unfinished job(s) claimed") and ran them again beside
the first server. Commands that only read, and ``keys create``, work beside the server;
doctor says which process holds the store; after a ``kill -9`` of the server the kernel
has released its lock and a new server starts."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

from tests.factories.ports import free_port
from tests.factories.server_process import (
    create_key_cli,
    radserve_command,
    run_radserve,
    start_server,
    stop_servers,
)
from tests.factories.service import config_file

from radserve.config import load_settings
from radserve.store.audited import open_audited


def _unowned_job(config: Path, data: Path) -> str:
    """A queued job no server holds (the running server does not poll for such: one
    server alone owns every job): the one a second server claimed at its start."""
    store, _trail = open_audited(load_settings(config, data_dir=data), create=False)
    try:
        record = store.create_job(
            priority_class="OUTPATIENT",
            deadline=dt.timedelta(hours=1),
            pipeline_name="test-pipeline",
            pipeline_version="1",
            precision="fp32",
            fingerprint="f" * 64,
            study_path=str(data / "studies" / "none"),
        )
        store.transition(record.id, "queued")
    finally:
        store.close()
    return record.id


def _job_and_requeues(data: Path, job_id: str) -> tuple[str, str | None, int]:
    """The job's state and lease owner, and how many ``job.requeued`` records it has."""
    with closing(sqlite3.connect(data / "radserve.db")) as connection:
        state, owner = connection.execute(
            "SELECT state, lease_owner FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        (requeued,) = connection.execute(
            "SELECT count(*) FROM audit_records WHERE action = 'job.requeued' AND subject = ?",
            (job_id,),
        ).fetchone()
    return state, owner, requeued


def test_a_second_serve_on_the_data_dir_refuses_and_claims_nothing(tmp_path: Path) -> None:
    config, data = config_file(tmp_path), tmp_path / "data"
    create_key_cli(config, data, "admin")
    first = start_server(config, data, free_port(), tmp_path / "first.log")
    second: subprocess.Popen[str] | None = None
    try:
        job_id = _unowned_job(config, data)
        before = _job_and_requeues(data, job_id)
        # another port: the port check, which stopped it before, does not
        command = radserve_command(
            "serve", "--host", "127.0.0.1", "--port", str(free_port()),
            "--config", str(config), "--data-dir", str(data), "--cpu-workers", "1",
        )  # fmt: skip
        second = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = second.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # it started: the old behaviour
            second.kill()
            out, err = second.communicate()
            raise AssertionError(f"a second serve started on the data dir: {err[-3000:]}") from None
        assert second.returncode == 2, err[-3000:]
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err[-3000:]
        assert lines[0].startswith("error [data_dir_in_use]: the data dir "), lines[0]
        assert str(data) in lines[0] and f"pid {first.pid} on this host" in lines[0]
        assert "Traceback" not in out + err
        # the job is as it was: not claimed, not requeued
        assert _job_and_requeues(data, job_id) == before
        assert before[1] is None and before[2] == 0

        # beside the server: reads, a key, doctor (which names the server)
        listed = run_radserve("keys", "list", "--config", str(config), "--data-dir", str(data))
        assert listed.returncode == 0, listed.stderr
        verified = run_radserve("audit", "verify", "--config", str(config), "--data-dir", str(data))
        assert verified.returncode == 0, verified.stderr
        create_key_cli(config, data, "read")
        doctor = run_radserve(
            "doctor", "--no-ports", "--json", "--config", str(config), "--data-dir", str(data)
        )
        row = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
        assert row["status"] == "ok", row
        assert f"in use by `radserve serve` pid {first.pid} on this host" in row["detail"]
        assert first.poll() is None  # still serving

        # kill -9: the kernel lets the lock go; a new server starts, doctor names nobody
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        doctor = run_radserve(
            "doctor", "--no-ports", "--json", "--config", str(config), "--data-dir", str(data)
        )
        row = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
        assert "in use" not in row["detail"], row
        first = start_server(config, data, free_port(), tmp_path / "restarted.log")
    finally:
        if second is not None and second.poll() is None:
            second.kill()
            second.wait(30)
        stop_servers([first])
