"""Child process of the install crash test: install a bundle, killed at a chosen step.

Run as ``python -m tests.factories.install_child BUNDLE DATA_DIR KILL_AT``. The real
:func:`radserve.lifecycle.install.install_bundle` runs with ``os.fsync`` and
``os.rename`` counted: the KILL_AT-th of those calls SIGKILLs the process before it is
made (0: none is). Prints how many calls the install made. KILL_AT ``hold``: the install
prints its staged bundle's folder once it is staged and waits there until stdin closes
(a live install beside another process).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radserve.lifecycle.install import install_bundle
from radserve.lifecycle.requirements import HostFacts

HOST = HostFacts(
    ort_version="1.24.1",
    providers=("CPUExecutionProvider",),
    runs_bf16=False,
    free_memory_mb=4096,
)


def hold(root: Path, _spec: object) -> None:
    """The ``prepare`` step of a held install: say where it is staged, wait for stdin."""
    print(root, flush=True)
    sys.stdin.read()


def main(bundle: Path, data_dir: Path, kill_at: int) -> None:
    calls = 0

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args)

        return call

    os.fsync, os.rename = counted(os.fsync), counted(os.rename)  # type: ignore[assignment]
    install_bundle(bundle, data_dir, host=HOST)
    print(calls)


if __name__ == "__main__":
    if sys.argv[3] == "hold":
        install_bundle(Path(sys.argv[1]), Path(sys.argv[2]), host=HOST, prepare=hold)
    else:
        main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
