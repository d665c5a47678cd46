"""``radserve gateway scp`` (and ``radserve serve``'s gateway) started on an address it
cannot listen on, and stopped as systemd and ``timeout`` stop it: the real command in a
fresh interpreter, as a user runs it.

A bad address printed a traceback per receiving process and ``RuntimeError: the 2
receiving processes did not start``; a SIGTERM to the process group killed the receiving
processes first, so the parent warned "starting another" and started them again, and a
second SIGTERM while stopping crashed in pynetdicom's shutdown."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.ports import free_port
from tests.factories.server_process import radserve_command, run_radserve
from tests.factories.service import config_file
from tests.factories.waits import until

pytestmark = pytest.mark.slow

UNPARSABLE = "0.0.0.0.0"
NOT_HERE = "10.255.255.1"  # private, unrouted: no interface of a test host has it


def _scp_args(data: Path, host: str, port: int, receivers: int) -> list[str]:
    return [
        "gateway",
        "scp",
        "--host",
        host,
        "--port",
        str(port),
        "--data-dir",
        str(data),
        "--receivers",
        str(receivers),
        "--allow",
        "STORESCU@127.0.0.1",  # no "any peer may store" warning among the lines read
    ]


def _os_reason(host: str, port: int) -> str:
    """What the OS answers to a bind of ``host``:``port`` (skipped where it binds: the
    case cannot be made on this host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return str(exc.strerror)
    pytest.skip(f"{host}:{port} is bindable on this host")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("receivers", [1, 2])
@pytest.mark.parametrize("case", ["unparsable", "unparsable, any port", "not here", "taken"])
def test_scp_on_an_address_it_cannot_bind_says_so_in_one_line(
    tmp_path: Path, taken_port: int, case: str, receivers: int
) -> None:
    host, port = {
        "unparsable": (UNPARSABLE, free_port()),
        "unparsable, any port": (UNPARSABLE, 0),  # doctor's check skips port 0
        "not here": (NOT_HERE, free_port()),
        "taken": ("127.0.0.1", taken_port),
    }[case]
    reason = _os_reason(host, port)
    result = run_radserve(*_scp_args(tmp_path, host, port, receivers), timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"{host}:{port} not bindable: {reason}" in line
    assert result.stdout == ""


class _Running:
    """A command started in a session of its own (a signal to its group reaches it and
    its children, not pytest), its output read as it comes."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            radserve_command(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout or []:
            self.lines.append(line)

    def stop(self, how: str) -> int:
        """SIGTERM it ``how``; its exit status once it and every child have ended.

        "group": once to the whole group (systemd's KillMode=control-group); "process
        twice": to the process, and again while it stops (an impatient operator);
        "process, then group": to the process, then to the group as it stops (what
        ``timeout`` does). The second signal is sent every 50 ms while it runs, so that
        one reaches it inside its stop."""
        group = self.process.pid  # the session leader's id is the group's
        if how == "group":
            os.killpg(group, signal.SIGTERM)
        else:
            self.process.send_signal(signal.SIGTERM)
            for _ in range(10):
                time.sleep(0.05)
                if self.process.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    if how == "process twice":
                        self.process.send_signal(signal.SIGTERM)
                    else:
                        os.killpg(group, signal.SIGTERM)
        code = self.process.wait(60)
        until(lambda: not _alive(group), "the receiving processes to end", 30)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    @property
    def output(self) -> str:
        return "".join(self.lines)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _stopped_quietly(code: int, output: str) -> None:
    assert code == 0, output
    assert "Traceback" not in output
    assert "starting another" not in output


@pytest.mark.parametrize(
    ("how", "receivers"),
    [
        ("process twice", 1),
        ("process twice", 2),
        ("group", 2),  # with receivers: 1 there is no child to kill
        ("process, then group", 1),
        ("process, then group", 2),
    ],
)
def test_scp_stops_on_sigterm_without_restarting_receivers(
    tmp_path: Path, how: str, receivers: int
) -> None:
    command = _Running(_scp_args(tmp_path, "127.0.0.1", free_port(), receivers))
    try:
        until(lambda: "listening as" in command.output, "the SCP to listen", 60)
        time.sleep(0.5)  # the receiving processes wait on their sockets
        _stopped_quietly(command.stop(how), command.output)
    finally:
        command.kill()


def test_serve_stops_on_group_sigterm_without_restarting_receivers(tmp_path: Path) -> None:
    """``radserve serve`` exited 0 but warned twice that a receiving process ended."""
    port = free_port()
    config = config_file(tmp_path, gateway={"enabled": True, "port": 0, "receivers": 2})
    args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--config", str(config)]
    command = _Running([*args, "--data-dir", str(tmp_path / "data"), "--cpu-workers", "1"])
    try:

        def serving() -> bool:
            assert command.process.poll() is None, command.output
            return "radserve serving on" in command.output

        until(serving, "the server to serve", 120, state=lambda: command.output[-2000:])
        assert "2 receiving processes" in command.output
        time.sleep(0.5)
        _stopped_quietly(command.stop("group"), command.output)
    finally:
        command.kill()
