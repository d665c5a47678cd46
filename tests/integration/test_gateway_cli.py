"""``radserve gateway echo|scp`` against real associations on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.factories.dicom_net import dcmtk_tool, free_port, small_study, storescu
from tests.factories.waits import wait_until

from radserve.commands.gateway import EXIT_REJECTED, EXIT_UNREACHABLE, group
from radserve.gateway import GatewaySCP, Peer, ScpConfig


def _echo(port: int, calling: str = "RADSERVE") -> tuple[int, str]:
    args = ["echo", "--host", "127.0.0.1", "--port", str(port), "--ae", "RADSERVE"]
    result = CliRunner().invoke(group, [*args, "--calling-ae", calling, "--timeout", "3"])
    return result.exit_code, result.output


def test_echo_exit_status_tells_what_happened(tmp_path: Path) -> None:
    config = ScpConfig(data_dir=tmp_path, port=0, allowed_peers=(Peer("RADSERVE"),))
    with GatewaySCP(config, lambda _: None) as server:
        port = server.address[1]
        assert _echo(port) == (0, f"C-ECHO to RADSERVE@127.0.0.1:{port} succeeded\n")
        code, output = _echo(port, calling="STRANGER")
        assert code == EXIT_REJECTED and "calling AE title not recognised" in output
    code, output = _echo(free_port())
    assert code == EXIT_UNREACHABLE and "cannot connect to RADSERVE@127.0.0.1:" in output


@pytest.mark.slow
@pytest.mark.tools
@pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed")
def test_standalone_scp_prints_each_completed_study(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-c", "from radserve.commands.gateway import group; group()"]
    command += ["scp", "--port", str(port), "--data-dir", str(tmp_path / "gw"), "--quiet", "1"]
    command += ["--allow", "STORESCU@127.0.0.1"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or []), daemon=True)
    reader.start()
    try:
        files = small_study(tmp_path / "sent", slices=range(10, 13))
        assert wait_until(lambda: storescu("127.0.0.1", port, files[:1]).returncode == 0, 20, 0.3)
        assert storescu("127.0.0.1", port, files[1:]).returncode == 0
        assert wait_until(lambda: lines, timeout=15)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    reader.join(5)
    [line] = lines
    assert line.startswith("study ") and " complete: 3 instances in " in line
    assert line.strip().endswith(str(tmp_path / "gw" / "gateway" / "incoming" / line.split()[1]))
    assert process.returncode == 0
