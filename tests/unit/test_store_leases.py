"""Job leases (radserve.store.leases): claim, renewal, expiry take-over, and the fence
that keeps a replica that lost a job from writing a second result or delivery.

Every test needs only a ``store`` fixture; tests/integration/test_store_postgres.py runs
them against PostgreSQL too. Times are passed explicitly (no sleeping)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.test_store_jobs import new_job

from radserve.store import JobState, Lease, LeaseLostError, Store, init_store
from radserve.store.outbox import NewDelivery, OutboxKind, OutboxState, OutboxStore

LEASE_S = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield s
    s.close()


def _bundle(job_id: str, owner: str, uid: str) -> NewDelivery:
    return NewDelivery(
        destination="fhir",
        path=f"/results/{uid}.json",
        sop_class_uid="",
        sop_instance_uid=uid,
        study_instance_uid="1.2.3",
        transfer_syntax_uid="",
        job_id=job_id,
        kind=OutboxKind.FHIR,
        held_for=owner,
    )


def test_a_zombie_replica_records_nothing_after_a_take_over(store: Store) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    job = new_job(store, lease=a)
    assert job.lease_owner == a.owner
    store.transition(job.id, JobState.QUEUED, owner=a.owner)
    store.transition(job.id, JobState.RUNNING, owner=a.owner)
    outbox = OutboxStore(store.engine)
    now = dt.datetime.now(dt.UTC)
    outbox.add([_bundle(job.id, a.owner, "bundle-a")], now=now)

    # while A's lease runs, B takes nothing
    assert store.claim_jobs(b, shared=True, now=now) == []
    # after it expired, B takes the job, and A's held delivery goes
    later = now + dt.timedelta(seconds=LEASE_S + 1)
    [claimed] = store.claim_jobs(b, shared=True, now=later)
    assert claimed.record.id == job.id and claimed.handed_over
    assert claimed.previous_owner == a.owner and claimed.previous_state == "running"
    assert claimed.record.state is JobState.QUEUED
    assert outbox.items(job_id=job.id) == []

    # A wakes up: every write of its run is refused, nothing of it is recorded
    with pytest.raises(LeaseLostError):
        store.record_result(job.id, "/results/a", owner=a.owner)
    with pytest.raises(LeaseLostError):
        store.transition(job.id, JobState.FAILED, owner=a.owner, error_code="x")
    # its deliveries too: a row queued after the take-over stayed held for good
    with pytest.raises(LeaseLostError):
        outbox.add([_bundle(job.id, a.owner, "bundle-a2")], now=later)

    store.transition(job.id, JobState.RUNNING, owner=b.owner)
    outbox.add([_bundle(job.id, b.owner, "bundle-b")], now=later)
    done = store.record_result(job.id, "/results/b", owner=b.owner)
    assert done.state is JobState.SUCCEEDED and done.result_path == "/results/b"
    states = {i.sop_instance_uid: i.state for i in outbox.items(job_id=job.id)}
    assert states == {"bundle-b": OutboxState.PENDING}
    # the sender never sees a held row
    due = outbox.claim_due(later, kind=OutboxKind.FHIR)
    assert [i.sop_instance_uid for i in due] == ["bundle-b"]


def test_renewal_keeps_a_lease_and_reports_what_is_held(store: Store) -> None:
    a, b = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    first, second = new_job(store, lease=a), new_job(store, lease=a)
    store.transition(second.id, JobState.CANCELLED)
    now = dt.datetime.now(dt.UTC)
    # renewed just before the first expiry: the job stays A's past it
    near = now + dt.timedelta(seconds=LEASE_S - 1)
    assert store.renew_leases(a, now=near) == {first.id}
    assert store.claim_jobs(b, shared=True, now=now + dt.timedelta(seconds=LEASE_S + 1)) == []
    taken = store.claim_jobs(b, shared=True, now=near + dt.timedelta(seconds=LEASE_S + 1))
    assert [c.record.id for c in taken] == [first.id]
    assert store.renew_leases(a, now=near) == set()


def test_a_lease_may_take_refuses_does_not_count_toward_the_limit(store: Store) -> None:
    # the earliest deadlines are A's, whose leases this replica may not take yet; the
    # limit is met with C's (it used to count A's rows: nothing was taken)
    a, c, b = (Lease.new(name, LEASE_S) for name in ("replica-a", "replica-c", "replica-b"))
    a_jobs = [new_job(store, lease=a, deadline=dt.timedelta(seconds=60 + i)) for i in range(2)]
    c_jobs = [new_job(store, lease=c, deadline=dt.timedelta(seconds=600 + i)) for i in range(3)]
    now = dt.datetime.now(dt.UTC)
    store.renew_leases(a, now=now + dt.timedelta(seconds=5))
    store.renew_leases(c, now=now)
    later = now + dt.timedelta(seconds=LEASE_S + 10)
    asked: list[dt.datetime] = []

    def may_take(renewed: dt.datetime, length: dt.timedelta) -> bool:
        asked.append(renewed)
        return renewed < now + dt.timedelta(seconds=1)

    taken = store.claim_jobs(b, shared=True, now=later, may_take=may_take, limit=2)
    assert [t.record.id for t in taken] == [j.id for j in c_jobs[:2]]
    assert len(asked) == 4  # A's two, passed over once each, then C's first two
    rest = store.claim_jobs(b, shared=True, now=later, may_take=may_take, limit=5)
    assert [t.record.id for t in rest] == [c_jobs[2].id]
    assert {store.get_job(j.id).lease_owner for j in a_jobs} == {a.owner}


def test_a_restarted_instance_takes_back_its_own_jobs_at_once(store: Store) -> None:
    old, other = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    mine, theirs = new_job(store, lease=old), new_job(store, lease=other)
    new = Lease.new("replica-a", LEASE_S)  # started after its predecessor's last renewal
    claimed = store.claim_jobs(new, shared=True)
    assert [c.record.id for c in claimed] == [mine.id]
    assert not claimed[0].handed_over  # its own earlier incarnation: same result folder
    # one server alone (SQLite, the default) holds every lease: it takes all
    alone = store.claim_jobs(Lease.new("solo", LEASE_S), shared=False)
    assert {c.record.id for c in alone} == {mine.id, theirs.id}


def test_without_others_only_the_own_instance_s_expired_jobs_are_taken(store: Store) -> None:
    # a replica that cannot tell yet whether the database was away (just started, or
    # it just came back) leaves another replica's expired lease alone
    old, other = Lease.new("replica-a", LEASE_S), Lease.new("replica-b", LEASE_S)
    mine, theirs = new_job(store, lease=old), new_job(store, lease=other)
    new = Lease.new("replica-a", LEASE_S)
    expired = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=LEASE_S + 1)
    claimed = store.claim_jobs(new, shared=True, others=False, now=expired)
    assert [c.record.id for c in claimed] == [mine.id]
    [later] = store.claim_jobs(new, shared=True, now=expired)
    assert later.record.id == theirs.id and later.handed_over


def test_a_cancellation_by_request_is_not_fenced(store: Store) -> None:
    a = Lease.new("replica-a", LEASE_S)
    job = new_job(store, lease=a)
    cancelled = store.transition(job.id, JobState.CANCELLED)  # from any replica's API
    assert cancelled.state is JobState.CANCELLED
