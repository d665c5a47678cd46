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
lost; both replicas held their work during the outage and went on after it, and their
``/metrics`` said so meanwhile (``radserve_scheduler_held{reason="lease_unproven"}``,
``radserve_scheduler_held_seconds``; before session 17 nothing showed it).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.replicas import leased_replicas, per_job, rows_of, unfinished_jobs
from tests.factories.service import make_study
from tests.factories.waits import until

from radserve.store.db import normalise_url

WAIT_S = 300.0
N_STUDIES = 8
JOB_LEASE_S = 6.0
OUTAGE_S = 2.5 * JOB_LEASE_S  # every lease runs out while the database is away
SLOW_GRID = {"n_slices": 48, "rows": 96, "cols": 96, "spacing": (2.0, 1.5, 1.5)}
HELD = 'radserve_scheduler_held{reason="lease_unproven"} 1.0'


def held_seconds(metrics: str) -> float:
    """``radserve_scheduler_held_seconds`` in a /metrics page."""
    [line] = [m for m in metrics.splitlines() if m.startswith("radserve_scheduler_held_seconds ")]
    return float(line.split()[1])


@pytest.mark.slow
def test_an_outage_longer_than_the_lease_runs_no_job_twice(tmp_path: Path) -> None:
    studies = [
        make_study(tmp_path / f"s{i}", background=-100.0, **SLOW_GRID) for i in range(N_STUDIES)
    ]
    with PrivatePostgres() as pg, leased_replicas(tmp_path, pg.url, job_lease_s=JOB_LEASE_S) as r:
        engine = create_engine(normalise_url(pg.url), pool_pre_ping=True)
        rows = rows_of(engine)
        servers, urls, logs = r.servers, r.urls, r.logs
        try:
            # all at once: each replica's queue holds jobs (leased) behind the running one
            ids = r.submit(studies)
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
            down_at = time.monotonic()

            def metrics() -> list[str]:
                return [httpx.get(f"{url}/metrics", timeout=30).text for url in urls]

            # /metrics (no key, no database needed) shows the held scheduler meanwhile
            until(
                lambda: all(HELD in page for page in metrics()),
                "both replicas' /metrics to show their work held",
                OUTAGE_S,
                step=0.5,
            )
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            assert all(held_seconds(page) > 0.0 for page in metrics())
            pg.start_again()
            until(
                lambda: all(HELD not in page and held_seconds(page) == 0.0 for page in metrics()),
                "both replicas' /metrics to show work going on",
                WAIT_S,
                step=0.5,
            )
            for server in servers:
                assert server.poll() is None, "a replica exited in the outage"

            until(lambda: not unfinished_jobs(rows), "every job to finish", WAIT_S)
            states = dict(rows("SELECT id, state FROM jobs"))
            assert states == dict.fromkeys(ids, "succeeded")

            assert per_job(rows, "job.started") == dict.fromkeys(ids, 1)
            assert per_job(rows, "job.succeeded") == dict.fromkeys(ids, 1)
            assert per_job(rows, "job.requeued") == {}
            # each job kept the replica that accepted it; each result in its own folder
            assert dict(rows("SELECT id, lease_owner FROM jobs")) == owners
            for job_id, path in rows("SELECT id, result_path FROM jobs"):
                assert Path(path).name == job_id and (Path(path) / "report.json").is_file()
        finally:
            engine.dispose()
    texts = [log.read_text() for log in logs]
    for log, text in zip(logs, texts, strict=True):
        # the outage outlasted the proof of the leases: work was held, then went on
        assert "no new work starts" in text, f"{log.name} never held its work"
        assert "renewed again; work goes on" in text, log.name
        assert "lease passed to another replica" not in text, log.name
        assert "taken over from other replicas" not in text, log.name
