"""A database outage longer than the job lease, under two real ``radserve serve``
replicas sharing a private PostgreSQL server (never the machine's shared one) and one
data folder.

Before: every lease ran out during the outage, and when the database came back each
replica took the other's jobs over (``job.requeued``, ``lease_expired``) while their
owner, alive, went on running them: both ran them, one result was kept. Now a replica
takes over another's jobs only once the database has answered it for a whole lease
(the owner renews within a second of its return), and an owner that cannot renew
starts no new work (radserve.service.leases).

Checked, counting runs from the audit chain: every job is started once
(``job.started``), succeeds once, is never requeued, and keeps its first owner; none is
lost; both replicas held their work during the outage and went on after it.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine
from tests.factories.dicom_net import free_port
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.replicas import replica_config, rows_of
from tests.factories.server_process import create_key_cli, start_server, stop_servers
from tests.factories.service import auth, make_study, upload
from tests.factories.waits import until

from radserve.store.db import normalise_url

WAIT_S = 300.0
N_STUDIES = 8
JOB_LEASE_S = 6.0
OUTAGE_S = 2.5 * JOB_LEASE_S  # every lease runs out while the database is away
SLOW_GRID = {"n_slices": 48, "rows": 96, "cols": 96, "spacing": (2.0, 1.5, 1.5)}


@pytest.mark.slow
def test_an_outage_longer_than_the_lease_runs_no_job_twice(tmp_path: Path) -> None:
    studies = [
        make_study(tmp_path / f"s{i}", background=-100.0, **SLOW_GRID) for i in range(N_STUDIES)
    ]
    with PrivatePostgres() as pg:
        engine = create_engine(normalise_url(pg.url), pool_pre_ping=True)
        rows = rows_of(engine)
        data = tmp_path / "data"
        configs = [
            replica_config(
                tmp_path,
                n,
                pg.url,
                None,
                job_lease_s=JOB_LEASE_S,
                outbox_lease_s=5.0,
                server={"store_wait_s": 60.0},
                # one job at a time per replica: the others wait in its queue, leased
                scheduler={"max_running": 1},
            )
            for n in ("a", "b")
        ]
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        key = create_key_cli(configs[0], data)
        servers: list[subprocess.Popen[bytes]] = []
        try:
            for config, port, log in zip(configs, ports, logs, strict=True):
                servers.append(start_server(config, data, port, log))

            def submit(i: int) -> str:
                r = httpx.post(
                    f"{urls[i % 2]}/v1/studies",
                    files=upload(studies[i]),
                    headers=auth(key),
                    timeout=120,
                )
                assert r.status_code == 202, r.text
                return str(r.json()["id"])

            # all at once: each replica's queue holds jobs (leased) behind the running one
            with ThreadPoolExecutor(N_STUDIES) as pool:
                ids = list(pool.map(submit, range(N_STUDIES)))
            owners = dict(rows("SELECT id, lease_owner FROM jobs"))
            assert {o.split("/")[0] for o in owners.values()} == {"replica-a", "replica-b"}
            until(
                lambda: rows("SELECT count(*) FROM jobs WHERE state = 'running'")[0][0] >= 1,
                "a job to run",
                WAIT_S,
            )
            unfinished = rows("SELECT count(*) FROM jobs WHERE state <> 'succeeded'")[0][0]
            assert unfinished >= 4, "the jobs finished before the outage"

            pg.shut_down()
            time.sleep(OUTAGE_S)
            pg.start_again()
            for server in servers:
                assert server.poll() is None, "a replica exited in the outage"

            until(
                lambda: (
                    rows(
                        "SELECT count(*) FROM jobs WHERE state IN ('received', 'queued', 'running')"
                    )[0][0]
                    == 0
                ),
                "every job to finish",
                WAIT_S,
            )
            states = dict(rows("SELECT id, state FROM jobs"))
            assert states == dict.fromkeys(ids, "succeeded")

            def per_job(action: str) -> dict[str, int]:
                return dict(
                    rows(
                        "SELECT subject, count(*) FROM audit_records "
                        f"WHERE action = '{action}' GROUP BY subject"
                    )
                )

            assert per_job("job.started") == dict.fromkeys(ids, 1)
            assert per_job("job.succeeded") == dict.fromkeys(ids, 1)
            assert per_job("job.requeued") == {}
            # each job kept the replica that accepted it; each result in its own folder
            assert dict(rows("SELECT id, lease_owner FROM jobs")) == owners
            for job_id, path in rows("SELECT id, result_path FROM jobs"):
                assert Path(path).name == job_id and (Path(path) / "report.json").is_file()
        finally:
            stop_servers(servers)
            engine.dispose()
    texts = [log.read_text() for log in logs]
    for log, text in zip(logs, texts, strict=True):
        # the outage outlasted the proof of the leases: work was held, then went on
        assert "no new work starts" in text, f"{log.name} never held its work"
        assert "renewed again; work goes on" in text, log.name
        assert "lease passed to another replica" not in text, log.name
        assert "taken over from other replicas" not in text, log.name
