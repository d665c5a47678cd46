"""Outbox rows on PostgreSQL are dated and judged in the database's clock, not each
replica's (:meth:`radserve.store.outbox.OutboxStore.now`), against a real server
(``RADSERVE_TEST_DATABASE_URL``) and a real slow PACS (a pynetdicom acceptor on loopback).

Before, each replica wrote and compared outbox times in its own clock (job leases have
used the database's since session 43: tests/integration/test_lease_clock_skew.py). With
one replica's clock two minutes off: rows it queued or rescheduled were due two minutes
late (ahead) or at once (behind) for the others; its ``sending`` rows' lease looked two
minutes old to a correct replica (behind: taken over while being sent, stored twice) or
two minutes young (ahead: a dead sender's rows waited two minutes past their lease).
Here the shifted clock is the outbox store's own (``DbClock(local=...)``, the host clock
it reads); a correct-clock replica judges the rows with the database's time.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from tests.factories.awkward_peer import scripted_peer
from tests.factories.postgres import requires_postgres, store_on
from tests.factories.waits import until

from radserve.gateway.outbox import DeliveryReport, Outbox, RetryPolicy
from radserve.gateway.scu import StoreSCU
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.store import Store
from radserve.store.db_clock import DbClock
from radserve.store.outbox import OutboxState, OutboxStore
from radserve.store.records import utc_now

pytestmark = requires_postgres

SKEW = dt.timedelta(seconds=120)
LEASE = dt.timedelta(seconds=16)  # shorter than the skew: a lease is minutes, the skew too
ANSWER_DELAY_S = 1.5  # the PACS answers each C-STORE after this pause
RETRY_S = 5.0
CLOSE_S = 1.5  # a time "now" is within this of the database's now
SKEWS = pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with store_on("postgresql", tmp_path, "radserve_outbox_skew") as opened:
        yield opened


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    phantom = generate_phantom(PhantomSpec.random(7, small=True), range(10, 14))
    return write_dicom_series(phantom, tmp_path / "study")


def _shifted(by: dt.timedelta) -> Callable[[], dt.datetime]:
    return lambda: utc_now() + by


def _database_now(store: Store) -> dt.datetime:
    with store.engine.connect() as connection:
        return connection.execute(select(func.clock_timestamp())).scalar_one()


def _scu() -> StoreSCU:
    # one attempt at most 8 s: the lease (16 s) covers it and is renewed mid-batch
    return StoreSCU(
        connect_timeout_s=1.0, acse_timeout_s=1.0, dimse_timeout_s=3.0, network_timeout_s=3.0
    )


def _replica(store: Store, name: str, peer_destination: object, skew: dt.timedelta) -> Outbox:
    rows = OutboxStore(store.engine, instance=name, clock=DbClock(_shifted(skew)))
    policy = RetryPolicy(first_delay_s=RETRY_S, max_delay_s=RETRY_S)
    return Outbox(rows, [peer_destination], _scu(), policy=policy, lease=LEASE)  # type: ignore[list-item]


def _close(when: dt.datetime, to: dt.datetime) -> bool:
    return abs((when - to).total_seconds()) < CLOSE_S


def _between(when: dt.datetime, start: dt.datetime, end: dt.datetime) -> bool:
    slack = dt.timedelta(seconds=0.5)
    return start - slack <= when <= end + slack


@SKEWS
def test_rows_a_shifted_replica_queues_and_reschedules_are_due_in_the_database_s_time(
    store: Store, files: list[Path], skew: dt.timedelta
) -> None:
    correct = OutboxStore(store.engine, instance="replica-a")
    with scripted_peer(statuses=(0xA700,)) as peer:  # out of resources: retried later
        shifted = _replica(store, "replica-c", peer.destination, skew)
        start = _database_now(store)
        [queued] = shifted.enqueue(files[:1])
        # queued now by the database's clock (before: two minutes off)
        assert _close(queued.created, start), (queued.created, start)
        assert _close(queued.next_attempt_at, start), (queued.next_attempt_at, start)

        report = shifted.deliver_pending()
    assert report.claimed == 1 and report.retried == 1, report
    [row] = correct.items()
    assert row.state is OutboxState.PENDING and row.attempts == 1
    failed_at = _database_now(store)
    due = failed_at + dt.timedelta(seconds=RETRY_S)
    assert _close(row.next_attempt_at, due), (row.next_attempt_at, due)
    # a correct replica (the lane's sender may be any) retries it when its back-off ends,
    # not two minutes early or late
    assert correct.claim_due(failed_at, lease=LEASE) == []
    [retried] = correct.claim_due(due + dt.timedelta(seconds=CLOSE_S), lease=LEASE)
    assert retried.id == row.id and retried.attempts == 2


@SKEWS
def test_a_shifted_sender_s_lease_runs_by_the_database_s_clock(
    store: Store, files: list[Path], skew: dt.timedelta
) -> None:
    correct = OutboxStore(store.engine, instance="replica-a")
    with scripted_peer(delay_s=ANSWER_DELAY_S) as peer:
        shifted = _replica(store, "replica-c", peer.destination, skew)
        shifted.enqueue(files, now=_database_now(store) - dt.timedelta(seconds=1))
        reports: dict[str, DeliveryReport] = {}
        sending = threading.Thread(target=lambda: reports.update(c=shifted.deliver_pending()))
        start = _database_now(store)
        sending.start()
        try:
            until(lambda: len(peer.received) >= 1, "the shifted sender's batch going out", 30)
            [claimed, *_] = [r for r in correct.items() if r.state is OutboxState.SENDING]
            assert claimed.lease_owner == shifted.store.owner
            # claimed at the database's time (before: two minutes off)
            assert _between(claimed.updated, start, _database_now(store)), claimed.updated

            # the batch outlives most of its lease: renewed, in the database's time too
            def renewed() -> bool:
                return any(
                    r.state is OutboxState.SENDING
                    and (r.updated - claimed.updated).total_seconds() > 2.0
                    for r in correct.items()
                )

            until(renewed, "the shifted sender renewing its lease", 30)
            now = _database_now(store)
            [row] = [r for r in correct.items() if r.state is OutboxState.SENDING]
            assert _close(row.updated, now), (row.updated, now)
            # a correct replica takes no row of the live lease (before, behind: the lease
            # looked two minutes old and every row was stored a second time) ...
            assert correct.claim_due(now, lease=LEASE) == []
            # ... and takes a stuck sender's row once its lease ran out by the database's
            # clock (before, ahead: two minutes later)
            [taken] = correct.claim_due(now + LEASE + dt.timedelta(seconds=CLOSE_S), lease=LEASE)
            assert taken.id == row.id and taken.lease_owner == correct.owner
        finally:
            sending.join(60)
    assert not sending.is_alive()
    report = reports["c"]
    assert report.claimed == len(files) and report.sent >= len(files) - 1, report


@SKEWS
def test_a_result_s_deliveries_are_released_due_at_the_database_s_time(
    store: Store, monkeypatch: pytest.MonkeyPatch, skew: dt.timedelta
) -> None:
    """Recording a result releases the deliveries its run held (``held -> pending``):
    they are due at the database's time, not the recording host's. Before, a host ahead
    of the database delayed every result's SEG/SR by its skew for the other senders."""
    from tests.unit.test_store_jobs import new_job

    from radserve.store import JobState, Lease
    from radserve.store import store as store_module
    from radserve.store.outbox import NewDelivery, OutboxKind

    lease = Lease.new("replica-a", 30.0)
    job = new_job(store, lease=lease)
    store.transition(job.id, JobState.QUEUED, owner=lease.owner)
    store.transition(job.id, JobState.RUNNING, owner=lease.owner)
    rows = OutboxStore(store.engine)
    held = NewDelivery(
        destination="fhir", path="/results/b.json", sop_class_uid="", sop_instance_uid="b",
        study_instance_uid="1.2.3", transfer_syntax_uid="", job_id=job.id,
        kind=OutboxKind.FHIR, held_for=lease.owner,
    )  # fmt: skip
    rows.add([held], now=_database_now(store))
    monkeypatch.setattr(store_module, "utc_now", _shifted(skew))  # this host's clock is off
    store.record_result(job.id, "/results/a", owner=lease.owner)
    [item] = rows.items(job_id=job.id)
    assert item.state is OutboxState.PENDING
    assert _close(item.next_attempt_at, _database_now(store)), (item.next_attempt_at, skew)
