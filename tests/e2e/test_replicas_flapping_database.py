"""A replica killed (SIGKILL) while the database fails every few seconds: the other
replica still takes its jobs over, and no job runs on two live replicas.

Two real ``radserve serve`` replicas share a private PostgreSQL server (never the
machine's shared one) and one data folder. After one is killed, the database is stopped
for about a second every few seconds, each time before a whole lease of answers has
passed. Before session 17 a replica took over another's jobs only after a whole lease of
*uninterrupted* answers, so the dead replica's jobs stayed queued for as long as the
database flapped. Now the answered time is counted in total (radserve.service.leases).

Checked from the audit chain: every job succeeds once; the dead replica's unfinished jobs
are requeued once each (``lease_expired``) and run by the live one; the live replica's
own jobs are never requeued and started once; a job the dead replica had not started is
started once (the one it was running when killed: once there, once again here).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.replicas import (
    UNFINISHED,
    leased_replicas,
    per_job,
    rows_of,
    unfinished_jobs,
)
from tests.factories.service import make_study
from tests.factories.waits import WAIT_SCALE, until

from radserve.store.db import normalise_url

WAIT_S = 300.0
N_STUDIES = 6
JOB_LEASE_S = 6.0
DOWN_S = 1.0
UP_S = 3.0  # the database answers for less than a lease at a time
MAX_FLAPS = 30  # a bound: the take-over needs a lease and a renewal of answers in all
SLOW_GRID = {"n_slices": 48, "rows": 96, "cols": 96, "spacing": (2.0, 1.5, 1.5)}


@pytest.mark.slow
def test_a_dead_replicas_jobs_are_taken_over_while_the_database_flaps(tmp_path: Path) -> None:
    studies = [
        make_study(tmp_path / f"s{i}", background=-100.0, **SLOW_GRID) for i in range(N_STUDIES)
    ]
    with PrivatePostgres() as pg, leased_replicas(tmp_path, pg.url, job_lease_s=JOB_LEASE_S) as r:
        engine = create_engine(normalise_url(pg.url), pool_pre_ping=True)
        rows = rows_of(engine)
        servers = r.servers
        try:
            ids = r.submit(studies)
            owners = {i: o.split("/")[0] for i, o in rows("SELECT id, lease_owner FROM jobs")}
            assert set(owners.values()) == {"replica-a", "replica-b"}

            servers[1].send_signal(signal.SIGKILL)
            assert servers[1].wait(60) == -signal.SIGKILL
            left = {
                job_id: state
                for job_id, state in rows(
                    "SELECT id, state FROM jobs "
                    f"WHERE lease_owner LIKE 'replica-b/%' AND {UNFINISHED}"
                )
            }
            assert left, "the killed replica had finished its jobs"
            started_there = {j for j, state in left.items() if state == "running"}

            def taken() -> bool:
                return not unfinished_jobs(rows, "lease_owner LIKE 'replica-b/%'")

            flaps = 0
            while not taken():
                assert flaps < MAX_FLAPS * WAIT_SCALE, "the dead replica's jobs were not taken"
                pg.shut_down()
                time.sleep(DOWN_S)
                pg.start_again()
                flaps += 1
                time.sleep(UP_S)
            assert servers[0].poll() is None, "the live replica exited"

            until(lambda: not unfinished_jobs(rows), "every job to finish", WAIT_S)
            assert dict(rows("SELECT id, state FROM jobs")) == dict.fromkeys(ids, "succeeded")

            assert per_job(rows, "job.succeeded") == dict.fromkeys(ids, 1)
            assert per_job(rows, "job.requeued") == dict.fromkeys(left, 1)
            started = per_job(rows, "job.started")
            assert started == {j: 2 if j in started_there else 1 for j in ids}, started
            assert {o.split("/")[0] for (o,) in rows("SELECT lease_owner FROM jobs")} == {
                "replica-a"
            } | {owners[j] for j in ids if j not in left}
        finally:
            engine.dispose()
    text = r.logs[0].read_text()
    assert "taken over from other replicas" in text
    assert "lease passed to another replica" not in text
