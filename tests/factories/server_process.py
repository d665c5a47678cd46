"""``radserve serve`` as a real subprocess for crash tests: start it (waiting for
``/healthz``), create an API key with the CLI, kill it however the test needs, find its
API reader processes and their audit writer."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from radserve.gateway.storage import study_instances
from tests.factories.waits import until


def radserve_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from radserve.cli import main; main()", *args]


def run_radserve(
    *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``radserve ARGS`` in a fresh interpreter, as a user runs it: its exit code and
    output (text), whatever they are (``timeout``: a bound for a hung command only)."""
    command = radserve_command(*args)
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def create_key_cli(
    config: Path, data: Path, role: str = "submit", *, name: str | None = None
) -> str:
    """A new API key from ``radserve keys create`` (the command itself, run in this
    process by click's runner: a fresh interpreter per key cost seconds of imports on a
    loaded runner, and the servers the tests start are fresh ones), named ``name``."""
    from click.testing import CliRunner

    from radserve.commands.keys import group

    args = ["create", "--role", role, "--config", str(config), "--data-dir", str(data)]
    args += ["--name", name] if name is not None else []
    created = CliRunner().invoke(group, args, catch_exceptions=False)
    assert created.exit_code == 0, created.output
    return created.stdout.strip().splitlines()[-1]


def start_server(
    config: Path, data: Path, port: int, log: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A running ``radserve serve`` on 127.0.0.1:``port`` (its output appended to ``log``;
    ``env``: variables added to this process's environment)."""
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
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", log)
    except AssertionError:
        process.kill()
        raise
    return process


def stop_servers(servers: Iterable[subprocess.Popen[bytes] | None], wait_s: float = 60) -> None:
    """SIGTERM each server still running and wait for it; kill one that does not stop."""
    for server in servers:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(wait_s)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)


def wait_healthy(
    process: subprocess.Popen[bytes],
    url: str,
    log: Path,
    timeout: float = 90.0,
    *,
    verify: Any = None,
) -> None:
    """Wait (:func:`tests.factories.waits.until`) until the server ``process`` started
    answers ``url``/healthz with 200; fail at once, with the tail of its ``log``, if it
    exits first (``verify``: httpx's, for HTTPS)."""
    options = {} if verify is None else {"verify": verify}

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}: {_tail(log)}")
        try:
            return httpx.get(f"{url}/healthz", timeout=2, **options).status_code == 200
        except httpx.TransportError:
            return False

    until(answers, f"{url}/healthz to answer 200", timeout, state=lambda: _tail(log), step=0.1)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def readers_of(pid: int) -> set[int]:
    """The server's reader processes (multiprocessing's spawned children, listed under
    the thread that started each, but the readers' audit writer). A thread or child may
    end between the listing and the read (a killed reader being reaped, a short-lived
    helper): it is not a reader then."""
    return {child for child in spawned_by(pid) if child not in audit_writers_of(pid)}


def audit_writers_of(pid: int) -> set[int]:
    """The readers' audit writer process (it names itself in ``/proc/PID/comm``)."""
    return {
        child
        for child in spawned_by(pid)
        if _read(Path(f"/proc/{child}/comm")).strip() == b"radserve-auditw"
    }


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def spawned_by(pid: int) -> set[int]:
    """multiprocessing's spawned children of ``pid``."""
    children = [
        child
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in _read(task / "children").split()
    ]
    return {
        int(child)
        for child in children
        if b"spawn_main" in _read(Path(f"/proc/{child.decode()}/cmdline"))
    }


def _tree(pid: int) -> list[int]:
    import psutil

    return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]


def peak_rss_mb(pid: int) -> float:
    """Peak RSS (``VmHWM``) of ``pid`` and its children since :func:`reset_peak_rss`."""
    total = 0.0
    for member in _tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:  # a child that ended
            continue
        line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
        total += int(line.split()[1]) / 1024
    return total


def reset_peak_rss(pid: int) -> None:
    """Reset the ``VmHWM`` of ``pid`` and its children to their present RSS."""
    for member in _tree(pid):
        with contextlib.suppress(OSError):  # a child that ended
            Path(f"/proc/{member}/clear_refs").write_text("5")


def gateway_pending(data: Path) -> list[Path]:
    """The gateway's study folders under ``data`` that hold received instances not yet a
    job (no job marker). A folder of refusals only (every instance of the study refused:
    its refusal record, no instance) waits for nothing and is never a job."""
    incoming = data / "gateway" / "incoming"
    if not incoming.is_dir():
        return []
    return [
        f
        for f in incoming.iterdir()
        if f.is_dir() and study_instances(f) and not (f / ".radserve-job.json").exists()
    ]
