"""What a decoding worker's native code writes on file descriptor 2 reaches the parent's
logging as records, also when the worker dies right after (tools/edge_probe.py found
GDCM's libjpeg printing "Bogus marker length", and a decoder aborting with "terminate
called after throwing ...", as plain lines among ``radserve serve``'s JSON log)."""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from tests.factories.waits import wait_until

from radserve.log_routing import NATIVE_STDERR_LOGGER, WorkerLogs, forward_worker_logs


def _native_line() -> int:
    os.write(2, b"Bogus marker length\n")  # as a C library does: not through sys.stderr
    return os.getpid()


def _native_abort() -> None:
    os.write(2, b"terminate called after throwing an instance of 'std::string'\n")
    os.abort()


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == NATIVE_STDERR_LOGGER]


def test_native_stderr_of_workers_is_logged_also_when_one_dies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    context = multiprocessing.get_context("spawn")
    logs = WorkerLogs(context)
    fifo = logs.initargs()[-1]
    try:
        with ProcessPoolExecutor(1, context, forward_worker_logs, logs.initargs()) as pool:
            assert pool.submit(_native_line).result(60) > 0
            assert wait_until(lambda: any("Bogus marker" in m for m in _messages(caplog)), 30)
        pool = ProcessPoolExecutor(1, context, forward_worker_logs, logs.initargs())
        with pool, pytest.raises(BrokenProcessPool):
            pool.submit(_native_abort).result(60)
    finally:
        logs.stop()  # logs what was read before the worker died, then stops
    messages = _messages(caplog)
    assert "a worker process wrote on stderr: Bogus marker length" in messages
    assert any("terminate called after throwing" in m for m in messages), messages
    assert fifo is not None and not os.path.exists(fifo)


def test_a_killed_servers_stderr_folder_is_swept_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed server never runs stop(): its FIFO's folder stayed in /tmp for good.
    The folder is owner-named (host, pid), and the next start removes it; a live
    server's is left alone."""
    import signal
    import subprocess
    import sys
    import tempfile

    from radserve import log_routing

    script = (
        "from radserve.log_routing import _NativeStderr; import time; "
        "n = _NativeStderr(); print(n._folder, flush=True); time.sleep(120)"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    alive = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        assert killed.stdout is not None and alive.stdout is not None
        left = Path(killed.stdout.readline().decode().strip())
        live = Path(alive.stdout.readline().decode().strip())
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert left.is_dir() and left.parent == tmp_path  # what SIGKILL leaves
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        relay = log_routing._NativeStderr()
        try:
            assert not left.exists()
            assert live.is_dir()
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
                [live.name, Path(relay._folder).name]
            )
        finally:
            relay.stop()
        assert not Path(relay._folder).exists()
    finally:
        alive.kill()
        alive.wait(10)
