"""The lease keeper's two rules against running a job on two replicas
(radserve.service.leases), driven round by round under a fake clock: no new work while
its leases are not proven, the jobs it did not renew failed here; and no take-over of
another replica's jobs until the database has answered for a whole lease.

The store is a real SQLite store; the scheduler is a stand-in that records what the
keeper asked of it (the real one's hold: tests/unit/test_scheduling_failures.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.test_store_jobs import new_job

from radserve.service.leases import LeaseKeeper
from radserve.store import Claimed, Lease, LeaseLostError, Store, init_store
from radserve.store.errors import DatabaseUnavailableError

LEASE_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Runs:
    """What a scheduler was told: held (why) and the jobs failed."""

    def __init__(self, unfinished: set[str]) -> None:
        self.jobs = set(unfinished)
        self.held: str | None = None
        self.failed: dict[str, str] = {}

    def hold(self, reason: str) -> None:
        self.held = reason

    def release(self) -> None:
        self.held = None

    def unfinished(self) -> set[str]:
        return set(self.jobs)

    def fail(self, job_id: str, error: LeaseLostError) -> bool:
        self.failed[job_id] = error.code
        self.jobs.discard(job_id)
        return True


class Away:
    """A store call that fails as an outage does."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = False

    def __getattr__(self, name: str) -> object:
        call = getattr(self.store, name)

        def maybe(*args: object, **kwargs: object) -> object:
            if self.down:
                raise DatabaseUnavailableError("database unavailable: connection refused")
            return call(*args, **kwargs)

        return maybe


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def _keeper(store: Away, lease: Lease, runs: Runs, clock: Clock) -> LeaseKeeper:
    claimed: list[Claimed] = []
    keeper = LeaseKeeper(
        store,  # type: ignore[arg-type]
        lease,
        shared=True,
        poll_s=1.0,
        on_claimed=claimed.extend,
        runs=runs,
        clock=clock,
    )
    keeper.claimed = claimed  # type: ignore[attr-defined]
    return keeper


def _round(keeper: LeaseKeeper, call: str) -> bool:
    failures = keeper._renewals if call == "renew" else keeper._take_overs
    return keeper._round(failures, getattr(keeper, call))


def test_work_is_held_while_the_lease_is_not_proven_and_lost_jobs_stop(store: Store) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    kept, lost = new_job(store, lease=a), new_job(store, lease=a)
    clock, runs, away = Clock(), Runs({kept.id, lost.id}), Away(store)
    keeper = _keeper(away, a, runs, clock)
    assert _round(keeper, "renew")
    keeper.check_proof()
    assert runs.held is None

    away.down = True  # the database goes away: renewals fail
    for _ in range(25):
        clock.now += 1.0
        assert not _round(keeper, "renew")
        keeper.check_proof()
    # proven for the lease less one renewal interval (20 s) after the last renewal
    assert runs.held is not None and keeper.holding

    # meanwhile another replica took one job over (its lease ran out)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=LEASE_S + 1)
    [taken] = store.claim_jobs(b, shared=True, now=later, limit=1)
    away.down = False
    clock.now += 1.0
    assert _round(keeper, "renew")
    keeper.check_proof()
    assert runs.held is None and not keeper.holding
    assert runs.failed == {taken.record.id: "lease_lost"}
    assert runs.jobs == {kept.id, lost.id} - {taken.record.id}


def test_no_take_over_until_the_database_answered_for_a_whole_lease(store: Store) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    theirs = new_job(store, lease=a)
    clock, away = Clock(), Away(store)
    keeper = _keeper(away, b, Runs(set()), clock)
    # A's lease has run out, but B has just come up (or the database just came back):
    # it cannot tell a dead owner from one that could not renew
    store.renew_leases(a, now=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=2 * LEASE_S))
    assert _round(keeper, "take_over")
    assert keeper.claimed == []  # type: ignore[attr-defined]
    clock.now += LEASE_S / 2
    assert _round(keeper, "take_over")
    assert keeper.claimed == []  # type: ignore[attr-defined]
    away.down = True  # an outage: the count starts again after it
    clock.now += 1.0
    assert not _round(keeper, "take_over")
    away.down = False
    clock.now += LEASE_S - 1.0
    assert _round(keeper, "take_over")
    assert keeper.claimed == []  # type: ignore[attr-defined]
    clock.now += LEASE_S
    assert _round(keeper, "take_over")
    assert [c.record.id for c in keeper.claimed] == [theirs.id]  # type: ignore[attr-defined]


def test_the_outage_is_logged_once_then_once_more_when_it_ends(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    a = Lease.new("replica-a", LEASE_S)
    clock, away = Clock(), Away(store)
    keeper = _keeper(away, a, Runs(set()), clock)
    away.down = True
    for _ in range(30):
        clock.now += 1.0
        _round(keeper, "renew")
    away.down = False
    _round(keeper, "renew")
    said = [r.getMessage() for r in caplog.records if r.name == "radserve.service.leases"]
    assert not any(r.exc_info for r in caplog.records)
    assert [m.split(" (")[0].split(" after")[0] for m in said] == [
        "leases: renew failed",
        "leases: renew works again",
    ], said
