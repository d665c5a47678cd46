"""Repository code in a child interpreter: for tests whose subject may kill its process
(a native decoder's abort, a segfault), so the test reads that death as an outcome
instead of dying with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    """This environment, with the repository's ``src`` and root on ``PYTHONPATH`` (the
    child imports ``radserve`` and ``tests`` from this checkout)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


def run_python(args: Sequence[str], *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the repository, its output captured as text; never raises for
    how the child ended (see :func:`how_it_ended`)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout_s,
        check=False,
    )


def how_it_ended(done: subprocess.CompletedProcess[str]) -> str:
    """ "signal SIGABRT" or "exit status N": for an assertion's message."""
    if done.returncode < 0:
        return f"signal {signal.Signals(-done.returncode).name}"
    return f"exit status {done.returncode}"
