"""The API reader processes (``server.read_processes``) answer ``GET /v1/jobs/{id}`` and
its report with a key by the same rule as the serving process, under ``security.visibility:
site``: site B's upload of a study site A's job analysed runs again (it is not answered
from A's result) and names A's job nowhere, and a job a local user of site B submitted is
site B's for B's keys. A real ``radserve serve`` with two readers."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from tests.factories.dicom_net import free_port
from tests.factories.server_process import readers_of, start_server
from tests.factories.service import auth, config_file, make_study, upload, wait_job

from radserve.commands.keys import group as keys_group
from radserve.passwords import hash_password

pytestmark = pytest.mark.slow

PASSWORD = "a-long-enough-password-1"


def _key(config: Path, data: Path, role: str, site: str) -> str:
    args = ["create", "--role", role, "--site", site, "--config", str(config)]
    created = CliRunner().invoke(keys_group, [*args, "--data-dir", str(data)])
    assert created.exit_code == 0, created.output
    return created.stdout.strip().splitlines()[-1]


def test_reader_processes_follow_the_rule_for_cached_jobs_and_local_users(
    tmp_path: Path,
) -> None:
    user = {
        "username": "bob",
        "role": "submit",
        "site": "B",
        "password_hash": hash_password(PASSWORD),
    }
    config = config_file(
        tmp_path,
        server={"read_processes": 2},
        security={"visibility": "site"},
        console={"users": [user]},
    )
    data, port = tmp_path / "data", free_port()
    keys = {
        "submit_a": _key(config, data, "submit", "A"),
        "submit_b": _key(config, data, "submit", "B"),
        "read_b": _key(config, data, "read", "B"),
        "read_a": _key(config, data, "read", "A"),
    }
    server = start_server(config, data, port, tmp_path / "server.log")
    try:
        assert len(readers_of(server.pid)) == 2
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as c:
            files = upload(make_study(tmp_path / "shared"))
            r = c.post("/v1/studies", files=files, headers=auth(keys["submit_a"]))
            assert r.status_code == 202, r.text
            a1 = r.json()["id"]
            assert wait_job(c, a1, keys["submit_a"])["state"] == "succeeded"
            # site B's upload of the same study is not answered from A's result (since
            # session 37: an instant "cached" told B that site A had analysed it)
            again = c.post("/v1/studies", files=files, headers=auth(keys["submit_b"]))
            assert again.status_code == 202 and again.json()["cached"] is False, again.text
            b1 = again.json()["id"]
            assert wait_job(c, b1, keys["submit_b"])["state"] == "succeeded"
        with httpx.Client(base_url=base, timeout=60) as bob:
            signed = bob.post(
                "/console/api/session", json={"username": "bob", "password": PASSWORD}
            )
            assert signed.status_code == 200, signed.text
            csrf = {"X-CSRF-Token": signed.json()["csrf"]}
            r = bob.post("/v1/studies", files=upload(make_study(tmp_path / "bob")), headers=csrf)
            assert r.status_code == 202, r.text
            u1 = r.json()["id"]
        with httpx.Client(base_url=base, timeout=60) as c:
            assert wait_job(c, u1, keys["read_b"])["state"] == "succeeded"
            for _ in range(6):  # new connections: either reader answers
                with httpx.Client(base_url=base, timeout=60) as fresh:
                    reader = auth(keys["read_b"])
                    status = fresh.get(f"/v1/jobs/{b1}", headers=reader)
                    assert status.status_code == 200, status.text
                    assert status.json()["cached"] is False and a1 not in status.text
                    report = fresh.get(f"/v1/jobs/{b1}/report", headers=reader)
                    assert report.status_code == 200 and a1 not in report.text
                    assert report.json()["job_id"] == b1
                    # bob's job is site B's
                    assert fresh.get(f"/v1/jobs/{u1}", headers=reader).status_code == 200
                    assert fresh.get(f"/v1/jobs/{u1}/report", headers=reader).status_code == 200
                    other = auth(keys["read_a"])
                    assert fresh.get(f"/v1/jobs/{u1}", headers=other).status_code == 404
                    seen = fresh.get(f"/v1/jobs/{b1}", headers=auth(keys["submit_a"]))
                    assert seen.status_code == 404
    finally:
        server.terminate()
        server.wait(60)
