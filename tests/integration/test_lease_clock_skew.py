"""Job leases on PostgreSQL are dated in the database's clock, not each replica's
(radserve.store.db_clock), against a real server (``RADSERVE_TEST_DATABASE_URL``).

Before, a replica wrote and compared lease times in its own clock. Measured with three
real replicas, one's clock shifted by an LD_PRELOAD shim: 120 s ahead, it took every job
of the others within 3 s (50 ``job.requeued``, their runs voided) and, killed, held its
own jobs for 128 s instead of about 8; 120 s behind, the others took all its jobs at
once. Here the shifted clock is the lease's own (``DbClock(local=...)``, the host clock
the lease code reads), a correct-clock replica judges the rows with the database's time
(the ``now`` the keeper passes), and the keeper of a shifted host is checked too.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from tests.factories.postgres import requires_postgres, store_on
from tests.unit.test_store_jobs import new_job

from radserve.service.leases import ClockOffsetCollector, LeaseKeeper
from radserve.store import Lease, Store
from radserve.store.db_clock import DbClock
from radserve.store.models import Job
from radserve.store.records import utc_now

pytestmark = requires_postgres

LEASE_S = 6.0
SKEW = dt.timedelta(seconds=120)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with store_on("postgresql", tmp_path, "radserve_skew") as s:
        yield s


def _shifted(by: dt.timedelta) -> Callable[[], dt.datetime]:
    return lambda: utc_now() + by


def _database_now(store: Store) -> dt.datetime:
    with store.engine.connect() as connection:
        return connection.execute(select(func.clock_timestamp())).scalar_one()


def _expires(store: Store, job_id: str) -> dt.datetime:
    with store.engine.connect() as connection:
        expires = connection.execute(select(Job.lease_expires).where(Job.id == job_id)).scalar()
    assert expires is not None
    return expires


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_shifted_owner_s_lease_runs_by_the_database_s_clock(
    store: Store, skew: dt.timedelta
) -> None:
    job = new_job(store)  # no lease yet: the first replica to claim it holds it
    owner = Lease.new("replica-c", LEASE_S, clock=DbClock(_shifted(skew)))
    [claimed] = store.claim_jobs(owner, shared=True)
    assert claimed.record.id == job.id
    assert owner.clock.offset_s == pytest.approx(-skew.total_seconds(), abs=1.0)
    # claimed and renewed in the database's time, whatever the owner's clock says
    for _ in range(2):
        start = _database_now(store)
        expires = _expires(store, job.id)
        assert abs((expires - start).total_seconds() - LEASE_S) < 1.0, expires - start
        assert store.renew_leases(owner) == {job.id}

    # a correct-clock replica does not take the live lease (before: a lease written by a
    # clock 120 s behind had expired two minutes before it was granted) ...
    other = Lease.new("replica-b", LEASE_S)
    assert store.claim_jobs(other, shared=True, now=_database_now(store)) == []
    assert store.get_job(job.id).lease_owner == owner.owner
    # ... and takes the dead owner's job once its true lease ran out (before: a clock
    # 120 s ahead held it for two minutes more)
    expired = _expires(store, job.id) + dt.timedelta(seconds=1)
    [taken] = store.claim_jobs(other, shared=True, now=expired)
    assert taken.record.id == job.id and taken.previous_owner == owner.owner


def test_a_job_accepted_on_a_shifted_host_is_leased_in_the_database_s_time(
    store: Store,
) -> None:
    clock = DbClock(_shifted(-SKEW))
    owner = Lease.new("replica-c", LEASE_S, clock=clock)
    store.renew_leases(owner)  # the keeper's first renewal measures the offset
    start = _database_now(store)
    job = new_job(store, lease=owner)
    # the store dates the new row in the host's clock; its lease is the database's
    assert abs((_expires(store, job.id) - start).total_seconds() - LEASE_S) < 1.0
    assert store.claim_jobs(Lease.new("replica-b", LEASE_S), shared=True, now=start) == []


def test_a_shifted_replica_s_keeper_takes_no_live_lease_and_says_its_clock_is_off(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    live = Lease.new("replica-a", LEASE_S)
    job = new_job(store, lease=live)
    store.renew_leases(live)
    # replica C's host clock runs 120 s ahead: its wall clock and its lease's both
    ahead = Lease.new("replica-c", LEASE_S, clock=DbClock(_shifted(SKEW)))
    claimed: list[object] = []
    keeper = LeaseKeeper(
        store,
        ahead,
        shared=True,
        poll_s=1.0,
        on_claimed=claimed.extend,
        wall=lambda: time.time() + SKEW.total_seconds(),
    )
    with caplog.at_level(logging.WARNING, logger="radserve.store.db_clock"):
        keeper.renew()
        keeper.renew()
    warnings = [r.getMessage() for r in caplog.records if r.name == "radserve.store.db_clock"]
    assert len(warnings) == 1, warnings  # once, not at every renewal
    assert "clock is 120." in warnings[0] and "ahead of the database's" in warnings[0]
    assert keeper.clock_offset_s == pytest.approx(-120.0, abs=1.0)
    assert keeper.database_time() == pytest.approx(time.time(), abs=1.0)
    [reason] = keeper.config_differences  # /readyz: degraded, naming the offset
    assert "120.0 s ahead of the database's" in reason
    [family] = ClockOffsetCollector(keeper).collect()
    assert family.name == "radserve_db_clock_offset_seconds"
    assert family.samples[0].value == pytest.approx(-120.0, abs=1.0)

    # it has had the database answer it for far more than a lease (before: its own
    # clock's seconds made every lease of the others look two minutes old)
    now = keeper.database_time()
    keeper.answered.reached(now - 60.0)
    keeper.answered.reached(now - 0.5)
    keeper.take_over()
    assert claimed == []
    assert store.get_job(job.id).lease_owner == live.owner
