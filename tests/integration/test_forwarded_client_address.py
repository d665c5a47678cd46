"""The client address radserve audits: a real ``radserve serve`` in both layouts (one
process; reader processes in front of the serving one). A client's own
``X-Forwarded-For``/``-Proto`` never reach the audit or the job; a proxy listed in
``server.trusted_proxies`` (127.0.0.2 here, a second loopback address) is believed, and
its client is audited. Submissions are forwarded by the readers, report reads are
answered by them: both paths are checked."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

from radserve.config import load_settings
from radserve.store.audited import open_audited

PROXY = "127.0.0.2"
FORGED = {
    "X-Forwarded-For": "203.0.113.9",
    "X-Forwarded-Proto": "https",
    "Forwarded": "for=1.2.3.4",
}


def _client(url: str, local: str) -> httpx.Client:
    """A client whose connections come from the loopback address ``local``."""
    return httpx.Client(
        base_url=url, timeout=60, transport=httpx.HTTPTransport(local_address=local)
    )


@pytest.mark.slow
@pytest.mark.parametrize("read_processes", [0, 2])
def test_forged_forwarded_headers_never_reach_the_audit(
    tmp_path: Path, read_processes: int
) -> None:
    server_section = {"read_processes": read_processes, "trusted_proxies": [PROXY]}
    config = config_file(tmp_path, server=server_section)
    data, log = tmp_path / "data", tmp_path / "server.log"
    key = create_key_cli(config, data)
    port = free_port()
    server = start_server(config, data, port, log)
    url = f"http://127.0.0.1:{port}"
    expected: dict[str, str] = {}  # job id -> the address its submission must be audited with
    try:
        for peer, headers, audited in [
            ("127.0.0.1", FORGED, "127.0.0.1"),  # a local process forging
            ("127.0.0.3", FORGED, "127.0.0.3"),  # another peer, not a trusted proxy
            (PROXY, {"X-Forwarded-For": "203.0.113.9, 198.51.100.7"}, "198.51.100.7"),
            (PROXY, {}, PROXY),  # a trusted proxy that names no client: the proxy itself
        ]:
            with _client(url, peer) as c:
                files = upload(make_study(tmp_path / f"study-{len(expected)}"))
                r = c.post("/v1/studies", files=files, headers={**auth(key), **headers})
                assert r.status_code == 202, r.text
                expected[r.json()["id"]] = audited
        job = next(iter(expected))
        with _client(url, PROXY) as c:
            assert wait_job(c, job, key, timeout=120)["state"] == "succeeded"
        reads = [
            ("127.0.0.3", FORGED, "127.0.0.3"),
            (PROXY, {"X-Forwarded-For": "203.0.113.9, 198.51.100.8"}, "198.51.100.8"),
        ]
        for peer, headers, _ in reads:
            with _client(url, peer) as c:
                r = c.get(f"/v1/jobs/{job}/report", headers={**auth(key), **headers})
                assert r.status_code == 200, r.text
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) in (0, -signal.SIGTERM)
    finally:
        if server.poll() is None:
            server.kill()

    store, _ = open_audited(load_settings(config, data_dir=data))
    try:
        assert {i: store.get_job(i).client_address for i in expected} == expected
        records = list(store.iter_audit())
    finally:
        store.close()
    submitted = {r.subject: r.client_address for r in records if r.action == "job.submitted"}
    assert {i: submitted[i] for i in expected} == expected
    read_from = [r.client_address for r in records if r.action == "phi.read" and r.subject == job]
    assert read_from == [audited for _, _, audited in reads]
