"""``radserve demo --serve`` (``make demo-serve``) on a port something already listens
on refuses at once, before the demo's minutes of work, naming the port and the way on
(a real socket holds the port; ``--small`` keeps the old code's run short)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.factories.server_process import run_radserve


def test_demo_serve_refuses_a_taken_port_before_making_the_study(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_radserve("demo", "--out", str(out), "--small", "--serve", "--port", str(port))
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"Invalid value for '--port': 127.0.0.1:{port} not bindable: Address already in use: "
        "is a radserve server already running on this host? Stop it, or give another port "
        "(`make demo-serve PORT=N`; 0: any free one)" in done.stderr
    ), done.stderr
    assert not out.exists()  # no phantom made, no pipeline run
