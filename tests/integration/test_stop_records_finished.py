"""SIGTERM to a real ``radserve serve`` while a job's last stages run: the stop waits for
the unit running then (its report), and the job's short stages after it (the result's
lineage, DICOM SEG/SR, publishing) run before the process exits, so its result is
recorded and a restart does not run it again.

Before, the executor stopped at that unit's end: the job's report was written ("study
done") but its next stage never ran, the job stayed ``running`` and ran again from its
ingest after the restart (t-ops #7: all 4 jobs ran twice).

The server runs with its report stage slowed (a child that wraps ``StudyWork._report``,
marking when it begins), so the SIGTERM lands in it; the audit's ``job.started``
records tell how often each job ran."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server, wait_healthy
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.waits import until

from radserve.config import load_settings
from radserve.store.audited import open_audited

# the report stage, slowed so the SIGTERM comes inside it; a file marks its start
_SLOW_REPORT = """
import os, pathlib, time
from radserve.pipeline import work as _work
_report = _work.StudyWork._report
def _slow(self):
    pathlib.Path(os.environ["MARKS"], str(self._job_id)).touch()
    time.sleep(float(os.environ["REPORT_S"]))
    return _report(self)
_work.StudyWork._report = _slow
from radserve.cli import main
main()
"""


def _serve_slow_report(
    config: Path, data: Path, port: int, log: Path, marks: Path
) -> subprocess.Popen[bytes]:
    """``radserve serve`` whose report stage takes 3 s longer (marks in ``marks``)."""
    command = [sys.executable, "-c", _SLOW_REPORT, "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--config", str(config), "--data-dir", str(data)]
    command += ["--cpu-workers", "1"]
    env = {**__import__("os").environ, "MARKS": str(marks), "REPORT_S": "3"}
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", log)
    except AssertionError:
        process.kill()
        raise
    return process


@pytest.mark.slow
def test_a_job_whose_report_was_written_during_the_stop_is_recorded_not_run_again(
    tmp_path: Path,
) -> None:
    config, data, log = config_file(tmp_path), tmp_path / "data", tmp_path / "server.log"
    marks = tmp_path / "marks"
    marks.mkdir()
    key = create_key_cli(config, data)
    studies = [make_study(tmp_path / f"study-{i}") for i in range(3)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve_slow_report(config, data, port, log, marks)
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            ids = []
            for files in studies:
                r = c.post("/v1/studies", files=upload(files), headers=auth(key))
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
        until(lambda: any(marks.iterdir()), "a job's report stage to begin", 120, step=0.05)
        in_report = next(marks.iterdir()).name
        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert server.wait(90) in (0, -signal.SIGTERM)
        stop_s = time.monotonic() - sent
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    text = log.read_text(errors="replace")
    assert "service stopped" in text
    assert "Traceback" not in text, text[-3000:]

    def audit() -> tuple[dict[str, str], Counter[str]]:
        store, _ = open_audited(load_settings(config, data_dir=data))
        try:
            states = {job_id: store.get_job(job_id).state.value for job_id in ids}
            started = Counter(r.subject for r in store.iter_audit() if r.action == "job.started")
        finally:
            store.close()
        return states, started

    at_stop, started_before = audit()
    # the job whose report was being written when the stop came finished before the exit
    assert at_stop[in_report] == "succeeded", (at_stop, text[-3000:])
    print(f"stop took {stop_s:.1f} s; states at the stop: {at_stop}")

    server = start_server(config, data, port, log)
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            for job_id in ids:
                assert wait_job(c, job_id, key, timeout=180)["state"] == "succeeded"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(90)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
    _, started = audit()
    # each job that succeeded before the stop ran once; the others ran again at most once
    for job_id, state in at_stop.items():
        if state == "succeeded":
            assert started[job_id] == started_before[job_id] == 1, (job_id, started)
        else:
            assert started[job_id] <= started_before[job_id] + 1, (job_id, started)
