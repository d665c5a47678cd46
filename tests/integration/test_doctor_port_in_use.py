"""A port something already listens on (a first-time user's running ``radserve serve``):
``radserve doctor`` and a second ``radserve serve`` say what the taken address probably
is and what to do, and say nothing of the kind for a port that fails for another reason
(real subprocesses, real sockets)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.factories.server_process import run_radserve
from tests.factories.service import config_file

# TEST-NET-1 (RFC 5737): no address of this host, so binding it fails, but not as "in use"
NOT_OURS = "192.0.2.1"


def test_doctor_and_serve_name_a_taken_port_as_a_running_server_and_how_to_go_on(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = config_file(
            tmp_path,
            server={"port": port},
            gateway={"enabled": True, "host": NOT_OURS, "port": 11112},
        )
        doctor = run_radserve("doctor", "--config", str(config), "--data-dir", data)
        serve = run_radserve("serve", "--config", str(config), "--data-dir", data)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "http port" in doctor.stdout and "dicom port" in doctor.stdout
    assert (
        f"note: 127.0.0.1:{port} in use, perhaps by this host's running `radserve serve`: "
        "`radserve doctor --no-ports` checks the rest" in doctor.stderr
    ), doctor.stderr
    # the DICOM port failed too, but for want of the address: not named as "in use"
    assert NOT_OURS not in doctor.stderr
    assert serve.returncode != 0
    assert f"127.0.0.1:{port} not bindable" in serve.stderr
    assert (
        f"note: 127.0.0.1:{port} in use: is a radserve server already running on this host? "
        "Stop it, or start this one on other ports (--port, gateway.port)" in serve.stderr
    ), serve.stderr
    assert f"note: {NOT_OURS}" not in serve.stderr
