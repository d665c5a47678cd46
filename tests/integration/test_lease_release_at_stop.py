"""A replica that stops cleanly lets its job leases go
(:meth:`radserve.service.leases.LeaseKeeper.release`), on SQLite and on a real
PostgreSQL (``RADSERVE_TEST_DATABASE_URL``).

Before, a graceful SIGTERM left its unfinished jobs leased until the lease ran out:
measured with three replicas and the default 60 s lease, the others took them over 76 s
later and 7 of 12 URGENT jobs missed their deadline. Now the others take them at their
next poll (``job.requeued``, ``reason: lease_released``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.postgres import requires_postgres, store_on
from tests.unit.test_store_jobs import new_job

from radserve.service.leases import LeaseKeeper
from radserve.store import Claimed, JobState, Lease, Store

LEASE_S = 60.0


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=requires_postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_release") as s:
        yield s


def _keeper(store: Store, lease: Lease, claimed: list[Claimed]) -> LeaseKeeper:
    return LeaseKeeper(store, lease, shared=True, poll_s=5.0, on_claimed=claimed.extend)


def _poll(keeper: LeaseKeeper) -> None:
    time.sleep(0.02)  # each round starts later than the last (the answered time)
    assert keeper._round(keeper._take_overs, keeper.take_over)


def test_a_clean_stop_hands_the_jobs_to_the_other_replicas_at_their_next_poll(
    store: Store,
) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    running, queued = new_job(store, lease=a), new_job(store, lease=a)
    store.transition(running.id, JobState.QUEUED, owner=a.owner)
    store.transition(running.id, JobState.RUNNING, owner=a.owner)
    done = new_job(store, lease=a)
    store.transition(done.id, JobState.CANCELLED)
    theirs = new_job(store, lease=b)
    taken: list[Claimed] = []
    other = _keeper(store, b, taken)
    stopping = _keeper(store, a, [])
    assert other._round(other._renewals, other.renew)
    _poll(other)
    _poll(other)
    assert taken == []  # A's leases run for a minute yet

    stopping.stop()  # the renewals end first, then the leases go
    assert stopping.release() == sorted([running.id, queued.id])
    _poll(other)  # the round that started before the release: not yet
    _poll(other)
    assert sorted(c.record.id for c in taken) == sorted([running.id, queued.id])
    assert all(c.previous_owner == a.owner and c.handed_over for c in taken)
    assert {c.record.id: c.previous_state for c in taken} == {
        running.id: "running",
        queued.id: "received",
    }
    reasons = {
        r.subject: r.payload["reason"] for r in store.iter_audit() if r.action == "job.requeued"
    }
    assert reasons == {running.id: "lease_released", queued.id: "lease_released"}
    assert store.get_job(theirs.id).lease_owner == b.owner
    assert store.get_job(done.id).state is JobState.CANCELLED


def test_a_restart_takes_its_released_jobs_back_and_nothing_is_released_twice(
    store: Store,
) -> None:
    first = Lease.new("replica-a", LEASE_S)
    job = new_job(store, lease=first)
    assert store.release_leases(first) == [job.id]
    assert store.release_leases(first) == [job.id]  # still its row: harmless again
    restarted = Lease.new("replica-a", LEASE_S)
    [claimed] = store.claim_jobs(restarted, shared=True, others=False)
    assert claimed.record.id == job.id and not claimed.handed_over
    assert store.release_leases(first) == []  # no longer its lease
