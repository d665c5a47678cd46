"""A real ``radserve serve`` in a subprocess, for tests of what only the whole server
does (settings read from a config file, the gateway bound where they say, HTTPS)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

from tests.factories.server_process import radserve_command, wait_healthy


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
        try:
            wait_healthy(self.process, self.url, self.log, verify=self.verify)
        except AssertionError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
