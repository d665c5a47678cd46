"""``radserve serve`` as a real subprocess for crash tests: start it (waiting for
``/healthz``), create an API key with the CLI, kill it however the test needs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.factories.waits import WAIT_SCALE


def radserve_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from radserve.cli import main; main()", *args]


def create_key_cli(config: Path, data: Path, role: str = "submit") -> str:
    created = subprocess.run(
        radserve_command(
            "keys", "create", "--role", role, "--config", str(config), "--data-dir", str(data)
        ),
        capture_output=True,
        text=True,
        check=True,
        timeout=60 * WAIT_SCALE,  # a CLI start on a loaded runner
    )
    return created.stdout.strip().splitlines()[-1]


def start_server(
    config: Path, data: Path, port: int, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    """A running ``radserve serve`` on 127.0.0.1:``port`` (its output appended to ``log``)."""
    command = radserve_command(
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
        *extra,
    )
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90 * WAIT_SCALE
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
