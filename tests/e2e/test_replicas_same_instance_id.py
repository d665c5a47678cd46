"""Two real ``radserve serve`` replicas on one PostgreSQL database (a fresh one) started
with the same ``outbox.instance_id`` -- a copied config. Each job they accept succeeds
once, neither takes the other's jobs, and ``/readyz`` names the other server while it
holds work (degraded, still 200).

Before, each took the other's jobs over at every take-over poll as its own instance's
predecessor's: four studies submitted to the two, all four failed within 2 s
(``job_duplicate`` after ``lease_lost``), no result, both ``/readyz`` ready with no
reason (a probe on session 23's code)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine
from tests.factories.dicom_net import free_port
from tests.factories.replicas import fresh_database, per_job, replica_config, rows_of
from tests.factories.server_process import create_key_cli, start_server, stop_servers
from tests.factories.service import auth, make_study, upload, wait_job
from tests.factories.waits import until

from radserve.store.db import normalise_url

GRID = {"n_slices": 48, "rows": 128, "cols": 128, "spacing": (2.0, 1.5, 1.5)}
N_JOBS = 4


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.mark.slow
def test_two_servers_with_one_instance_id_finish_every_job_once(
    tmp_path: Path, database_url: str
) -> None:
    engine = create_engine(normalise_url(database_url))
    rows = rows_of(engine)
    same = {"outbox": {"instance_id": "replica-a"}}
    configs = [
        replica_config(
            tmp_path,
            name,
            database_url,
            None,
            job_lease_s=6.0,
            outbox_lease_s=5.0,
            scheduler={"max_running": 1},
            **same,
        )
        for name in ("a", "b")
    ]
    data = tmp_path / "data"
    key = create_key_cli(configs[0], data)
    servers = []
    try:
        for name, config in zip("ab", configs, strict=True):
            servers.append(start_server(config, data, free_port(), tmp_path / f"{name}.log"))
        urls = [
            f"http://127.0.0.1:{s.args[s.args.index('--port') + 1]}"  # type: ignore[index]
            for s in servers
        ]
        ids = []
        for i in range(N_JOBS):
            study = make_study(tmp_path / f"s{i}", background=-100.0, **GRID)
            r = httpx.post(
                f"{urls[i % 2]}/v1/studies", files=upload(study), headers=auth(key), timeout=120
            )
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])

        def twin_named() -> bool:
            body = httpx.get(f"{urls[0]}/readyz", headers=auth(key), timeout=30).json()
            return any(
                "another server runs with this replica's instance id" in r
                for r in (body["reasons"])
            )

        until(twin_named, "replica a's /readyz to name the other server", 120)
        with httpx.Client(base_url=urls[1], timeout=30) as c:
            jobs = [wait_job(c, j, key, timeout=300) for j in ids]
    finally:
        stop_servers(servers)
    assert [j["state"] for j in jobs] == ["succeeded"] * N_JOBS, jobs
    assert per_job(rows, "job.succeeded") == dict.fromkeys(ids, 1)
    assert per_job(rows, "job.started") == dict.fromkeys(ids, 1)  # none taken over
    assert rows("SELECT count(*) FROM audit_records WHERE action = 'job.requeued'")[0][0] == 0
    engine.dispose()
