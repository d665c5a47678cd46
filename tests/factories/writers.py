"""A writer process that has ended and one still running: the two owners a sweep of
temporaries (:mod:`radserve.durable`, the gateway's instance store) must tell apart."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def ended_and_running() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """(the pid of a process that has exited, a running process); the running one is
    killed on exit (a test may kill it earlier to see its temporaries go)."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    running = subprocess.Popen(["sleep", "60"])
    try:
        yield ended.pid, running
    finally:
        running.kill()
        running.wait()
