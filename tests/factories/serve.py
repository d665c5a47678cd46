"""A real ``radserve serve`` in a subprocess, for tests of what only the whole server
does (settings read from a config file, the gateway bound where they say, HTTPS)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.factories.waits import WAIT_SCALE


def radserve_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from radserve.cli import main; main()", *args]


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class RadserveServe:
    """``radserve serve --config CONFIG`` on ``port``; up once /healthz answers (over
    HTTPS when ``verify`` is given: the CA file, or an ``ssl.SSLContext``)."""

    def __init__(
        self, config: Path, data: Path, port: int, log: Path, *, verify: Any = None
    ) -> None:
        self.command = radserve_command(
            "serve", "--port", str(port), "--config", str(config), "--data-dir", str(data)
        )
        self.command += ["--cpu-workers", "1", "--plain-logs"]
        scheme = "http" if verify is None else "https"
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.verify = verify
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RadserveServe:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90 * WAIT_SCALE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"radserve serve exited: {self.log.read_text()[-3000:]}")
            try:
                kwargs = {"verify": self.verify} if self.verify is not None else {}
                if httpx.get(f"{self.url}/healthz", timeout=1, **kwargs).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"radserve serve did not answer /healthz: {self.log.read_text()}")

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
