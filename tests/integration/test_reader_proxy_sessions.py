"""The API readers forward console requests to the serving process through one shared
client: it must never keep a console session cookie. It did (httpx's cookie jar): after
one user signed in, requests of other browsers that carried no cookie were signed in as
that user (a read-only session saw an admin's, and a fresh page skipped the sign-in).
Found by the console e2e tests once `server.read_processes: 2` became the default.
Real ``radserve serve`` with two reader processes; plain HTTP clients with their own
cookie jars, as browsers.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import config_file


def test_a_console_session_is_never_lent_to_another_client(tmp_path: Path) -> None:
    config = config_file(tmp_path, server={"read_processes": 2})
    data, port = tmp_path / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("admin", "read")}
    server = start_server(config, data, port, tmp_path / "server.log")
    base = f"http://127.0.0.1:{port}"
    try:
        for round_ in range(4):  # several connections, so both readers forward
            with httpx.Client(base_url=base, timeout=30) as admin:
                signed = admin.post(
                    "/console/api/session", json={"key": keys["admin"]}, headers={"Origin": base}
                )
                assert signed.status_code == 200, signed.text
                assert admin.get("/console/api/session").json()["role"] == "admin"
            with httpx.Client(base_url=base, timeout=30) as stranger:
                answer = stranger.get("/console/api/session")
                assert answer.status_code == 401, (round_, answer.text)
            with httpx.Client(base_url=base, timeout=30) as reader:
                signed = reader.post(
                    "/console/api/session", json={"key": keys["read"]}, headers={"Origin": base}
                )
                assert signed.status_code == 200, signed.text
                assert reader.get("/console/api/session").json()["role"] == "read"
    finally:
        server.terminate()
        server.wait(60)
