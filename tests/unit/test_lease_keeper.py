"""The lease keeper's two rules against running a job on two replicas
(radserve.service.leases), driven round by round under a fake clock: no new work while
its leases are not proven, the jobs it did not renew failed here; and no take-over of
another replica's job until, since that replica's last renewal, the database has
answered for a lease and one renewal interval in all (a flapping database delays the
take-over of a dead replica, it no longer postpones it for good).

The store is a real SQLite store; the scheduler is a stand-in that records what the
keeper asked of it (the real one's hold: tests/unit/test_scheduling_failures.py).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.test_store_jobs import new_job

from radserve.service.leases import HELD_REASON, AnsweredTime, LeaseKeeper
from radserve.service.schema_watch import SchemaWatch
from radserve.store import Claimed, JobState, Lease, LeaseLostError, Store, init_store
from radserve.store.errors import DatabaseUnavailableError
from radserve.store.migrate import head_revision

LEASE_S = 30.0


class Clock:
    """The keeper's clocks, monotonic and wall, in one (seconds since the epoch)."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float = 0.0) -> dt.datetime:
        """The wall-clock time ``seconds`` from now (a lease's renewal, as stored)."""
        return dt.datetime.fromtimestamp(self.now + seconds, dt.UTC)


class Runs:
    """What a scheduler was told: held (why) and the jobs failed."""

    def __init__(self, unfinished: set[str]) -> None:
        self.jobs = set(unfinished)
        self.held: str | None = None
        self.failed: dict[str, str] = {}

    def hold(self, reason: str, message: str) -> None:
        assert message
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
        wall=clock,
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
    assert runs.held == HELD_REASON and keeper.holding

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


def _claimed(keeper: LeaseKeeper) -> list[str]:
    return [c.record.id for c in keeper.claimed]  # type: ignore[attr-defined]


def test_no_take_over_until_the_owner_had_a_lease_of_answers_to_renew(store: Store) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    theirs = new_job(store, lease=a)
    clock, away = Clock(), Away(store)
    keeper = _keeper(away, b, Runs(set()), clock)  # B watches A's job
    start = clock.now
    store.renew_leases(a, now=clock.at())
    for _ in range(5):  # both answered
        assert _round(keeper, "take_over")
        clock.now += 1.0
    away.down = True  # an outage longer than the lease: A's lease runs out meanwhile
    while clock.now < start + 50.0:
        assert not _round(keeper, "take_over")
        clock.now += 1.0
    # back: B's round comes first, A (alive) renews a moment later and keeps its job
    away.down = False
    assert _round(keeper, "take_over")
    assert _claimed(keeper) == []
    clock.now += 0.5
    store.renew_leases(a, now=clock.at())
    while clock.now < start + 60.0:
        clock.now += 1.0
        assert _round(keeper, "take_over")
    store.renew_leases(a, now=clock.at())  # A's last renewal: then it dies
    died = clock.now
    # taken over once the database answered a lease and a renewal interval (40 s)
    # since then, as counted by the rounds before (1 s apart): A had that long to renew
    while not _claimed(keeper):
        clock.now += 1.0
        assert _round(keeper, "take_over")
    assert LEASE_S + LEASE_S / 3 < clock.now - died <= LEASE_S + LEASE_S / 3 + 2.0
    assert _claimed(keeper) == [theirs.id]


def test_a_flapping_database_delays_the_take_over_without_postponing_it(store: Store) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    theirs = new_job(store, lease=a)
    clock, away = Clock(), Away(store)
    keeper = _keeper(away, b, Runs(set()), clock)
    store.renew_leases(a, now=clock.at())  # then A dies
    died = clock.now
    rounds = 0
    # every fourth round fails: never 4 s of uninterrupted answers, half of the time
    # answered (2 s of each 4: the span around a failure does not count)
    while not _claimed(keeper):
        assert rounds < 200, "never taken over"
        away.down = rounds % 4 == 3
        assert _round(keeper, "take_over") is not away.down
        rounds += 1
        clock.now += 1.0
    assert clock.now - died >= 2 * (LEASE_S + LEASE_S / 3)
    assert _claimed(keeper) == [theirs.id]


def test_replicas_with_different_lease_lengths_judge_each_lease_by_its_own(
    store: Store,
) -> None:
    # B (30 s leases) watches dead owners whose jobs.lease_s differ from its own: each is
    # taken over once the database answered B for the owner's lease and renewal interval
    # (the row's renewal and expiry) since its last renewal -- not B's 30 + 10 s
    for name, owner_s in (("short", 6.0), ("long", 90.0)):
        a, b = Lease.new(f"{name}-a", owner_s), Lease.new(f"{name}-b", LEASE_S)
        theirs = new_job(store, lease=a)
        clock, away = Clock(), Away(store)
        keeper = _keeper(away, b, Runs(set()), clock)
        for _ in range(3):  # B's rounds answered before A's last renewal
            assert _round(keeper, "take_over")
            clock.now += 1.0
        store.renew_leases(a, now=clock.at())  # then A dies
        died = clock.now
        while not _claimed(keeper):
            assert clock.now - died < 300.0, f"{name}: never taken over"
            clock.now += 1.0
            assert _round(keeper, "take_over")
        assert _claimed(keeper) == [theirs.id]
        need_s = owner_s + owner_s / 3
        assert need_s < clock.now - died <= need_s + 2.0, name
        store.transition(theirs.id, JobState.CANCELLED)  # out of the next case's way


def test_answered_time_counts_spans_between_answered_rounds_and_forgets_the_oldest() -> None:
    answered = AnsweredTime(keep_s=10.0)
    for at in (0.0, 4.0):
        answered.reached(at)
    answered.failed()
    for at in (6.0, 9.0, 12.0):
        answered.reached(at)
    assert list(answered.spans) == [(0.0, 4.0), (6.0, 12.0)]
    assert answered.since(6.0) == 6.0 and answered.since(8.0) == 2.0
    assert answered.since(11.0) is None
    for at in (20.0, 30.0):
        answered.reached(at)
    assert list(answered.spans) == [(6.0, 30.0)]  # the rest hold 10 s and more


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


def test_a_changed_schema_is_acted_on_before_readiness_names_it(store: Store) -> None:
    """The hold and the stop come before /readyz names the change: a probe that sees
    "schema changed" never meets a server still admitting studies or handing out work
    (the integration test read the hold right after /readyz and, under load, met none).
    The database is left as it is (the PostgreSQL suite shares its schema): this keeper
    runs as an older radserve would, on a revision before the store's."""
    watch = SchemaWatch(store.engine, expected="0000_an_older_radserve")
    seen_when_acting: list[str | None] = []
    keeper = LeaseKeeper(
        store,
        Lease.new("replica-a", LEASE_S),
        shared=False,
        poll_s=1.0,
        on_claimed=lambda _: None,
        schema=watch,
        on_schema_changed=lambda why: seen_when_acting.append(watch.changed),
    )
    assert _round(keeper, "renew")
    assert seen_when_acting == [None]
    assert watch.changed is not None and head_revision() in watch.changed
    assert _round(keeper, "renew")
    assert seen_when_acting == [None]  # acted on once
