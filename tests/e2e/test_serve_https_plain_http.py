"""`radserve serve` with ``server.tls``: ``curl http://`` to its port (the scheme
mistyped) gets a 400 saying the port speaks HTTPS and naming the https:// address, and
the server's log one WARNING line with the client's address and nothing of the request;
HTTPS is served as before. One serving process here; with API reader processes (which
then terminate TLS) tests/e2e/test_serve_https.py checks the same answer.

Found on 2026-12-07: ``curl http://127.0.0.1:PORT/healthz`` printed "curl: (52) Empty
reply from server" and the server logged nothing."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.serve import RadserveServe
from tests.factories.service import config_file
from tests.factories.tls import HAVE_OPENSSL, make_pki
from tests.factories.waits import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed"),
]


def test_curl_over_plain_http_is_told_to_use_https(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
    config = config_file(tmp_path, server={"tls": tls, "read_processes": 0})
    verify = ssl.create_default_context(cafile=str(pki.ca))
    port = free_port()
    log = tmp_path / "serve.log"
    with RadserveServe(config, tmp_path / "data", port, log, verify=verify) as server:
        curl = subprocess.run(
            ["curl", "-sS", "-i", "--max-time", "20",
             f"http://127.0.0.1:{port}/v1/jobs?accession=ACC-SECRET-7"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert curl.returncode == 0, curl.stderr
        assert curl.stdout.startswith("HTTP/1.1 400 Bad Request")
        assert f"this port speaks HTTPS only: use https://127.0.0.1:{port}/" in curl.stdout
        line = "1 plain-HTTP connection(s) to the HTTPS port (last from 127.0.0.1): 400"
        until(lambda: line in log.read_text(), "the server's log line")
        assert httpx.get(f"{server.url}/healthz", verify=verify, timeout=10).status_code == 200
    text = log.read_text()
    assert "WARNING" in next(row for row in text.splitlines() if line in row)
    assert "ACC-SECRET" not in text
    assert f"radserve serving on https://127.0.0.1:{port}" in text
    assert f"running on http://127.0.0.1:{port}" not in text  # uvicorn's own line, untrue
