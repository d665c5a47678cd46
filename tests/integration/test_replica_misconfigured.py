"""A server set to run alone (``outbox.replicas`` 1, the default) on a PostgreSQL database
that live replicas use refuses to start instead of taking their jobs
(:meth:`radserve.store.leases.LeaseMixin.check_alone`), against a real server
(``RADSERVE_TEST_DATABASE_URL``).

Before, such a server (a copied single-server config) claimed every unfinished job at
start: measured with two live replicas, "22 unfinished job(s) claimed (22 taken over from
other replicas)", their runs voided and the jobs started twice.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from tests.factories.postgres import requires_postgres, store_on
from tests.unit.test_store_jobs import new_job

from radserve.error_table import lookup
from radserve.store import JobState, Lease, Store
from radserve.store.leases import ReplicasNotConfiguredError
from radserve.store.models import Job

LEASE_S = 60.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with store_on("postgresql", tmp_path, "radserve_alone") as s:
        yield s


def _expires(store: Store, job_id: str) -> dt.datetime:
    with store.engine.connect() as connection:
        expires = connection.execute(select(Job.lease_expires).where(Job.id == job_id)).scalar()
    assert expires is not None
    return expires


@requires_postgres
def test_a_server_alone_refuses_while_replicas_hold_live_leases(store: Store) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    jobs = [new_job(store, lease=a), new_job(store, lease=b), new_job(store, lease=a)]
    store.renew_leases(a)
    alone = Lease.new("ct-host", LEASE_S)  # outbox.instance_id unset: the host name

    with pytest.raises(ReplicasNotConfiguredError) as refused:
        store.check_alone(alone)
    error = refused.value
    assert error.code == "replicas_not_configured"
    assert lookup(error).exit == 2  # `radserve serve`: one line, exit 2
    assert a.owner in error.message and b.owner in error.message
    assert "outbox.replicas" in error.message and "stop the other servers" in error.message
    assert set(store.live_owners(alone)) == {a.owner, b.owner}
    # nothing was taken, and a claim that spares live leases takes none of theirs
    assert store.claim_jobs(alone, shared=False, spare_live=True) == []
    with store.engine.connect() as connection:
        owners = dict(connection.execute(select(Job.id, Job.lease_owner)).all())
    assert owners == {jobs[0].id: a.owner, jobs[1].id: b.owner, jobs[2].id: a.owner}

    # once their leases ran out (the replicas stopped or died), it starts and takes all
    later = max(_expires(store, j.id) for j in jobs) + dt.timedelta(seconds=1)
    store.check_alone(alone, now=later)
    taken = store.claim_jobs(alone, shared=False, spare_live=True, now=later)
    assert {c.record.id for c in taken} == {j.id for j in jobs}


@requires_postgres
def test_a_restart_of_the_same_server_is_not_refused(store: Store) -> None:
    # a server alone that crashed and is started again at once (same host name): its
    # predecessor's leases still run, and are its own to take back
    crashed = Lease.new("ct-host", LEASE_S)
    job = new_job(store, lease=crashed)
    restarted = Lease.new("ct-host", LEASE_S)
    store.check_alone(restarted)
    [claimed] = store.claim_jobs(restarted, shared=False, spare_live=True)
    assert claimed.record.id == job.id and not claimed.handed_over
    store.transition(job.id, JobState.CANCELLED)
    # a replica that let its leases go at a clean stop holds none either
    gone = Lease.new("replica-a", LEASE_S)
    new_job(store, lease=gone)
    store.release_leases(gone)
    store.check_alone(Lease.new("other-host", LEASE_S))


def test_sqlite_is_never_refused(tmp_path: Path) -> None:
    # one server per SQLite file: the data dir's lock refuses a second one already
    with store_on("sqlite", tmp_path, "unused") as store:
        new_job(store, lease=Lease.new("replica-a", LEASE_S))
        store.check_alone(Lease.new("ct-host", LEASE_S))
