"""Issue 16: ``radserve demo --serve`` runs the demo, then serves the web console on a
data dir under ``--out`` with the demo study submitted, prints the address (the real
port for ``--port 0``) and a demo admin key, and stops cleanly on SIGTERM; with the default
settings, so on a host with >= 2 cores its job reads are answered by API reader processes
(``server.read_processes`` "auto")."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from tests.factories.server_process import radserve_command, spawned_by
from tests.factories.waits import WAIT_SCALE, until

from radserve.host import usable_cores

pytestmark = pytest.mark.slow

CONSOLE_LINE = re.compile(r"^console: (http://127\.0\.0\.1:(\d+))/  \(sign in with key (\S+)\)$")


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))


def _console_line(lines: queue.Queue[str], process: subprocess.Popen[str]) -> re.Match[str]:
    """The demo's console line, read as the demo prints it; fails at once if the demo
    exits without it, and names what it printed either way."""
    seen: list[str] = []

    def printed() -> re.Match[str] | None:
        exited = process.poll() is not None  # before draining: its last lines are queued
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            seen.append(line)
            if match := CONSOLE_LINE.match(line):
                return match
        if exited:
            raise AssertionError(f"demo exited {process.returncode}: {seen}")
        return None

    return until(printed, "the demo's console line", 600, state=lambda: seen, step=0.2)


def test_demo_serve_prints_the_console_with_its_study_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADSERVE_")}  # defaults
    command = radserve_command(
        "demo", "--small", "--no-dicom", "--serve", "--port", "0", "--out", str(out)
    )
    with open(tmp_path / "demo.err", "wb") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        match = _console_line(lines, process)
        url, port, key = match.group(1), int(match.group(2)), match.group(3)
        assert port != 0
        assert (out / "server").is_dir()  # SQLite and files under the demo's --out
        with httpx.Client(base_url=url, timeout=60) as c:
            page = c.get("/")
            assert page.status_code == 200 and "<title>radserve console</title>" in page.text
            assert c.post("/console/api/session", json={"key": "rsk_wrong"}).status_code == 401
            signed = c.post("/console/api/session", json={"key": key})
            assert signed.status_code == 200, signed.text
            assert signed.json()["role"] == "admin"
            assert c.get("/console/api/worklist").status_code == 200  # the session works
            # the demo's phantom study went through the normal intake and runs to the end
            jobs: dict[str, Any] = {}

            def succeeded() -> bool:
                jobs.update(c.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).json())
                states = [j["state"] for j in jobs["items"]]
                assert len(states) == 1 and states[0] not in ("failed", "cancelled"), jobs
                return states == ["succeeded"]

            until(succeeded, "the demo's one job to succeed", 600, state=lambda: jobs, step=0.5)
            job_id = jobs["items"][0]["id"]  # a read a reader answers (the default layout)
            read = c.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"})
            assert read.status_code == 200 and read.json()["state"] == "succeeded", read.text
        spawned = spawned_by(process.pid)  # 2 readers and their audit writer
        assert len(spawned) == (3 if usable_cores() >= 2 else 0), spawned
        process.send_signal(signal.SIGTERM)
        assert process.wait(60 * WAIT_SCALE) == 0, (tmp_path / "demo.err").read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
