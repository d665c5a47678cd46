"""Two live servers started with the same ``outbox.instance_id`` (a copied config, a frozen
server started again elsewhere) on one database.

A server takes back at once the jobs of its instance's *predecessor* (restart recovery),
and that stays so: an incarnation whose last renewal came before this one began. One
that renews after it is alive: its jobs are judged like another replica's (taken only
once their lease expired and the take-over rule agrees), the lease keeper names it on
``/readyz``, and a job taken from it writes a result folder of its own.

Before, each took the other's jobs at every take-over poll: with two real replicas on
PostgreSQL (``replica-a`` twice) every one of four jobs failed within two seconds
(``job_duplicate`` after ``lease_lost``), and both ``/readyz`` said ready.

A SQLite store here (tests/integration/test_store_postgres.py style tests run the lease
rules on PostgreSQL; this one runs the same statements)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.test_store_jobs import new_job

from radserve.service.leases import LeaseKeeper
from radserve.store import Lease, Store, init_store
from radserve.store.leases import result_folder_name

LEASE_S = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def test_a_live_twin_s_jobs_are_not_taken_while_its_lease_runs(store: Store) -> None:
    first = Lease.new("replica-a", LEASE_S)
    twin = Lease.new("replica-a", LEASE_S)  # started while the first runs
    job = new_job(store, lease=first)
    now = dt.datetime.now(dt.UTC)
    store.renew_leases(first, now=now + dt.timedelta(seconds=5))  # alive after twin began

    assert store.claim_jobs(twin, shared=True, now=now + dt.timedelta(seconds=6)) == []
    assert store.claim_jobs(twin, shared=True, others=False, now=now) == []
    assert set(store.twins(twin)) == {first.owner}
    assert set(store.twins(first)) == set()  # the twin holds nothing yet

    # it stops renewing: taken once its lease expired, if the take-over rule agrees
    expired = now + dt.timedelta(seconds=5 + LEASE_S + 1)
    refused = store.claim_jobs(twin, shared=True, now=expired, may_take=lambda *_: False)
    assert refused == []
    [taken] = store.claim_jobs(twin, shared=True, now=expired, may_take=lambda *_: True)
    assert taken.record.id == job.id and taken.previous_owner == first.owner
    # the other server may still be writing results/<job id>: this run writes its own
    assert result_folder_name(job.id, taken, twin) == f"{job.id}.{twin.incarnation}"
    assert store.get_job(job.id).lease_owner == twin.owner
    # nor does the first take it back while the twin renews
    store.renew_leases(twin, now=expired)
    assert store.claim_jobs(first, shared=True, now=expired) == []
    assert set(store.twins(first)) == {twin.owner}


def test_a_predecessor_s_jobs_are_taken_back_at_once(store: Store) -> None:
    old = Lease.new("replica-a", LEASE_S)
    job = new_job(store, lease=old)  # renewed at creation, before the restart
    restarted = Lease.new("replica-a", LEASE_S)
    [claimed] = store.claim_jobs(restarted, shared=True, others=False)
    assert claimed.record.id == job.id and not claimed.handed_over
    assert store.twins(restarted) == {}
    # with replicas its folder is its own (a frozen predecessor may write on); one
    # server alone on SQLite keeps the job's folder
    assert result_folder_name(job.id, claimed, restarted) == f"{job.id}.{restarted.incarnation}"
    alone = Lease.new("solo", LEASE_S)
    job2 = new_job(store, lease=Lease.new("solo", LEASE_S))
    [own] = [c for c in store.claim_jobs(alone, shared=False) if c.record.id == job2.id]
    assert result_folder_name(job2.id, own, alone) == job2.id


def test_the_lease_keeper_names_a_twin_until_it_holds_nothing(store: Store) -> None:
    first = Lease.new("replica-a", LEASE_S)
    twin = Lease.new("replica-a", LEASE_S)
    job = new_job(store, lease=first)
    store.renew_leases(first)
    keeper = LeaseKeeper(store, twin, shared=True, poll_s=5.0, on_claimed=lambda _: None)
    keeper.renew()
    [reason] = keeper.config_differences
    assert f"another server runs with this replica's instance id replica-a (as {first.owner})" in (
        reason
    )
    assert reason.endswith("give each replica its own outbox.instance_id"), reason
    store.transition(job.id, "cancelled")
    keeper.renew()
    assert keeper.config_differences == []
