"""Ports for test servers, taken outside the kernel's ephemeral range.

A port the kernel handed out for ``bind(0)`` is an ephemeral port: once that socket is
closed, the kernel may give the same number to any outgoing connection (a database
client, an HTTP call, Orthanc's SCU) before the test server binds it, and the bind then
fails with "Address already in use" (seen in CI). Ports below the ephemeral range are
never handed to outgoing connections, so a free one stays free until the test binds it.

Under pytest-xdist each worker takes its own residue class of the range (port modulo the
workers' count), so two workers never hand out the same port between its check and its
bind: the set of ports given is per process.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FIRST = 20000  # above well-known and most registered service ports in use here
_given: set[tuple[str, int]] = set()
_lock = threading.Lock()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_share() -> tuple[int, int]:
    """(this pytest-xdist worker's index, the workers' count); (0, 1) outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return 0, 1
    return int(worker[2:]) % count, count


def free_port_on(host: str) -> int:
    """A port on ``host`` that is free now, outside the ephemeral range, and not handed
    out before in this process (two servers of one test never get the same one) nor in
    another pytest-xdist worker."""
    end = _ephemeral_start()
    start = _FIRST if end - _FIRST >= 1000 else 1024
    index, count = _worker_share()
    with _lock:
        for _ in range(200):
            port = random.randrange(start + index, end, count)
            if (host, port) in _given:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _given.add((host, port))
            return port
    raise RuntimeError(f"no free port on {host} in {start}-{end - 1} after 200 tries")


def free_port() -> int:
    """A free port on the loopback address (see :func:`free_port_on`)."""
    return free_port_on("127.0.0.1")
