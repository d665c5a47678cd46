"""One sender per destination among servers sharing a PostgreSQL database
(:mod:`radserve.store.lane_lock`), against the test server: the lock is exclusive per
(schema, kind, destination), freed when its holder's session ends (a killed replica's
backend is terminated), and the lane that takes it re-queues the rows its previous
holder left ``sending``. SQLite gets no lock (one server process)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from tests.factories.postgres import postgres_schema, requires_postgres

from radserve.store import Store, init_store
from radserve.store.lane_lock import LaneHold, LaneLock, lane_lock
from radserve.store.outbox import (
    NewDelivery,
    OutboxKind,
    OutboxState,
    OutboxStore,
    Scope,
    Settlement,
)

NOW = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)


@pytest.fixture
def store() -> Iterator[Store]:
    with postgres_schema("radserve_lanes") as url:
        store = init_store(url)
        try:
            yield store
        finally:
            store.close()


RUN = uuid.uuid4().hex[:8]  # this run's owners: its sessions' names are its own


def _locks(store: Store, kind: str, destination: str, n: int = 2) -> list[LaneLock]:
    locks = [lane_lock(store.engine, kind, destination, owner=f"r{i}/{RUN}") for i in range(n)]
    assert all(lock is not None for lock in locks)
    return [lock for lock in locks if lock is not None]


@requires_postgres
def test_one_holder_per_destination_and_a_dead_holder_s_lock_is_taken_over(
    store: Store,
) -> None:
    a, b = _locks(store, "dicom", "PACS")
    other_a, other_b = _locks(store, "dicom", "VNA")
    critical = _locks(store, "critical", "PACS", n=1)[0]
    try:
        assert a.hold() is LaneHold.TAKEN
        assert b.hold() is LaneHold.ELSEWHERE  # never waits for it
        assert a.hold() is LaneHold.HELD
        # other destinations, and other kinds of the same name, are senders of their own
        assert other_b.hold() is LaneHold.TAKEN
        assert other_a.hold() is LaneHold.ELSEWHERE
        assert critical.hold() is LaneHold.TAKEN
        # the holder's session ends as a killed replica's does: its lock goes with it
        # the timeout makes it wait for the session to end, not only signal it (PostgreSQL 14+)
        with store.engine.connect() as connection:
            terminated = connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": f"radserve lane dicom:PACS r0/{RUN}"},
            ).all()
        assert terminated == [(True,)]
        assert b.hold() is LaneHold.TAKEN
        assert a.hold() is LaneHold.ELSEWHERE  # noticed its lost session, did not send
        assert not a.held and b.held
        b.release()  # a server stopping gives it up: taken at the next try
        assert a.hold() is LaneHold.TAKEN
    finally:
        for lock in (a, b, other_a, other_b, critical):
            lock.release()


@requires_postgres
def test_installations_in_other_schemas_of_one_database_do_not_share_locks(
    store: Store,
) -> None:
    with postgres_schema("radserve_lanes_other") as url:
        other = init_store(url)
        try:
            [here] = _locks(store, "dicom", "PACS", n=1)
            [there] = _locks(other, "dicom", "PACS", n=1)
            try:
                assert here.hold() is LaneHold.TAKEN
                assert there.hold() is LaneHold.TAKEN
            finally:
                here.release()
                there.release()
        finally:
            other.close()


@requires_postgres
def test_taking_a_lane_over_requeues_only_its_rows_another_sender_left_sending(
    store: Store,
) -> None:
    dead = OutboxStore(store.engine, instance="replica-a")
    taker = OutboxStore(store.engine, instance="replica-b")

    def delivery(uid: str, destination: str, kind: OutboxKind) -> NewDelivery:
        return NewDelivery(
            destination=destination,
            path=f"/results/{uid}.dcm",
            sop_class_uid="1.2.840.10008.5.1.4.1.1.66.4",
            sop_instance_uid=uid,
            study_instance_uid="1.2.3",
            transfer_syntax_uid="1.2.840.10008.1.2.1",
            kind=kind,
        )

    dead.add(
        [
            delivery("1.1", "PACS", OutboxKind.DICOM),
            delivery("1.2", "PACS", OutboxKind.DICOM),
            delivery("1.3", "VNA", OutboxKind.DICOM),
            delivery("1.4", "PACS", OutboxKind.CRITICAL),
        ],
        now=NOW,
    )
    for kind in (OutboxKind.DICOM, OutboxKind.CRITICAL):
        assert dead.claim_due(NOW, kind=kind)  # every row "sending" under replica a
    [sent] = [i for i in dead.items(destination="PACS") if i.sop_instance_uid == "1.1"]
    assert dead.settle_all([Settlement.sent(sent.id, now=NOW)])[0]
    [own] = taker.add([delivery("1.5", "PACS", OutboxKind.DICOM)], now=NOW)
    assert taker.claim_due(NOW, scope=Scope("PACS"))[0].id == own.id

    later = NOW + dt.timedelta(seconds=3)  # long before the rows' 15-minute lease
    assert taker.take_over_lane(kind=OutboxKind.DICOM, scope=Scope("PACS"), now=later) == 1
    states = {(i.kind, i.sop_instance_uid): i for i in taker.items()}
    requeued = states[(OutboxKind.DICOM, "1.2")]
    assert (requeued.state, requeued.next_attempt_at, requeued.attempts) == (
        OutboxState.PENDING,
        later,
        1,  # its attempt still counts
    )
    assert requeued.lease_owner is None
    assert states[(OutboxKind.DICOM, "1.1")].state is OutboxState.SENT
    assert states[(OutboxKind.DICOM, "1.5")].state is OutboxState.SENDING  # the taker's own
    assert states[(OutboxKind.DICOM, "1.3")].state is OutboxState.SENDING  # another lane
    assert states[(OutboxKind.CRITICAL, "1.4")].state is OutboxState.SENDING  # another kind


def test_sqlite_has_no_lane_lock(tmp_path: Path) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        assert lane_lock(store.engine, "dicom", "PACS", owner="r/x") is None
    finally:
        store.close()
