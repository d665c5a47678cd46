"""Issue 15: two real ``radserve serve`` replicas sharing one PostgreSQL database (a
fresh one per test) and one data folder. Replica A accepts every study and is killed
with SIGKILL mid-run; replica B takes over A's jobs once their leases expire and
finishes them: each job succeeds exactly once (one recorded result, one
``job.succeeded`` audit record) and each job's FHIR Bundle is delivered exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine
from tests.factories.dicom_net import free_port
from tests.factories.fhir_server import FhirServer
from tests.factories.replicas import fresh_database, replica_config, rows_of
from tests.factories.server_process import create_key_cli, start_server, stop_servers
from tests.factories.service import auth, make_study, upload
from tests.factories.waits import until

from radserve.store.db import normalise_url

# Bounds for waiting on conditions, generous for a loaded 2-core CI machine (a pass takes
# a minute or two). The leases are short enough to keep the test quick and long enough
# that a live replica starved of CPU for seconds still renews them (every third, 2 s):
# the leases of tests.factories.replicas.leased_replicas, which the lease-outage,
# flapping-database and restart tests pass with in CI. B takes A's jobs over a lease and
# a renewal interval after A's last renewal (8 s; 20 s with the 15 s lease before).
WAIT_S = 600.0
LEASES = {"job_lease_s": 6.0, "outbox_lease_s": 5.0}
N_JOBS = 4
SLOW_GRID = {"n_slices": 24, "rows": 96, "cols": 96, "spacing": (2.0, 1.5, 1.5)}


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.mark.slow
def test_a_killed_replica_s_jobs_are_finished_once_by_the_other(
    tmp_path: Path, database_url: str
) -> None:
    engine = create_engine(normalise_url(database_url))

    rows = rows_of(engine)

    with FhirServer() as fhir:
        config_a = replica_config(tmp_path, "a", database_url, fhir.url, **LEASES)
        config_b = replica_config(tmp_path, "b", database_url, fhir.url, **LEASES)
        data = tmp_path / "data"  # the shared data folder
        log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
        port_a, port_b = free_port(), free_port()
        key = create_key_cli(config_a, data)
        a = start_server(config_a, data, port_a, log_a)
        b: subprocess.Popen[bytes] | None = None
        try:
            b = start_server(config_b, data, port_b, log_b)
            ids = []
            with httpx.Client(base_url=f"http://127.0.0.1:{port_a}", timeout=60) as client:
                for i in range(N_JOBS):
                    study = make_study(tmp_path / f"s{i}", background=-100.0, **SLOW_GRID)
                    r = client.post("/v1/studies", files=upload(study), headers=auth(key))
                    assert r.status_code == 202, r.text
                    ids.append(r.json()["id"])
            owners = {r[0] for r in rows("SELECT lease_owner FROM jobs")}
            assert len(owners) == 1 and next(iter(owners)).startswith("replica-a/")
            # A is mid-run: a job running, and (most likely) none finished yet
            until(
                lambda: rows("SELECT count(*) FROM jobs WHERE state = 'running'")[0][0] >= 1,
                "a job to run on replica A",
                WAIT_S,
            )
            os.kill(a.pid, signal.SIGKILL)
            a.wait(30)
            unfinished = {
                r[0]
                for r in rows("SELECT id FROM jobs WHERE state IN ('received','queued','running')")
            }
            assert unfinished, "replica A finished everything before it was killed"

            with httpx.Client(base_url=f"http://127.0.0.1:{port_b}", timeout=60) as client:

                def all_done() -> bool:
                    states = [
                        client.get(f"/v1/jobs/{i}", headers=auth(key)).json()["state"] for i in ids
                    ]
                    return all(s in ("succeeded", "failed", "cancelled") for s in states)

                until(all_done, "replica B to finish replica A's jobs", WAIT_S)
                final = {i: client.get(f"/v1/jobs/{i}", headers=auth(key)).json() for i in ids}
            assert {i: j["state"] for i, j in final.items()} == dict.fromkeys(ids, "succeeded")

            # B took over exactly the jobs A left, after their leases expired
            taken = rows("SELECT subject, payload FROM audit_records WHERE action = 'job.requeued'")
            handed = {s for s, p in taken if '"lease_expired"' in p}
            assert handed == unfinished
            for job_id, owner in rows("SELECT id, lease_owner FROM jobs"):
                assert owner.startswith("replica-b/" if job_id in unfinished else "replica-a/")
            # exactly one result per job
            succeeded = rows(
                "SELECT subject, count(*) FROM audit_records "
                "WHERE action = 'job.succeeded' GROUP BY subject"
            )
            assert dict(succeeded) == dict.fromkeys(ids, 1)
            for job_id, path in rows("SELECT id, result_path FROM jobs"):
                assert (Path(path) / "report.json").is_file()
                # a taken-over job's result went to the new owner's own folder
                assert (Path(path).name != job_id) == (job_id in unfinished)

            # each job's Bundle delivered once, by one replica
            until(
                lambda: (
                    rows("SELECT count(*) FROM outbox_deliveries WHERE state = 'sent'")[0][0]
                    == N_JOBS
                ),
                "every bundle to be sent",
                WAIT_S,
            )
            outbox = rows("SELECT job_id, state, attempts FROM outbox_deliveries")
            assert sorted(r[0] for r in outbox) == sorted(ids)
            assert {r[1] for r in outbox} == {"sent"}
            # a row claimed by the killed replica is claimed again by the other and sent (at
            # least once): a claim counts an attempt before its request leaves, and a
            # replica claims several due rows at once, so A may have died after sending
            # some of its claimed rows, or none: each extra attempt is at most one extra POST
            extra_attempts = sum(r[2] - 1 for r in outbox)
            assert N_JOBS <= len(fhir.received) <= N_JOBS + extra_attempts
            assert len({r.json()["id"] for r in fhir.received}) == N_JOBS
        finally:
            stop_servers((a, b))
            engine.dispose()
    assert "taken over from other replicas" in log_b.read_text()
