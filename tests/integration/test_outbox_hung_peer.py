"""A destination that hangs (a PACS that takes the connection and never answers, as a
SIGSTOPped or wedged one does; a FHIR server that never answers a POST) against the real
outbox senders (pynetdicom's SCU, httpx) and a real store (found by the hospital-edge
probe of session 37):

- a failed attempt's retry is due its back-off after the attempt ended, not after it was
  claimed: each attempt waited out its timeout and its retry was due before it ended,
  so a hung PACS was tried back to back (ten associations in 100 s with a 5 s back-off,
  each logged "retry at" a past time);
- a destination's rows count as failing while a retry is under way (``sending``, with
  the previous attempt's error): a hung PACS keeps its rows ``sending`` most of the
  time, so ``radserve outbox list`` and ``/readyz`` showed no failure at all.

Time is passed in (``now``); the only waits are the peers' timeouts."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.dicom_net import small_study
from tests.factories.fhir_server import Answer, FhirServer

from radserve.config import load_settings
from radserve.fhir.delivery import FhirDestination, FhirOutbox
from radserve.gateway import Destination, Outbox, RetryPolicy, StoreSCU
from radserve.service.outbox import OutboxOps
from radserve.store import Store, init_store
from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

T0 = dt.datetime(2026, 3, 1, 8, 0, tzinfo=dt.UTC)
TIMEOUT_S = 2.0  # each attempt waits this long for the hung peer
DELAY = dt.timedelta(seconds=5)  # the back-off after a first failure


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    yield opened
    opened.close()


@pytest.fixture
def hung() -> Iterator[int]:
    """A port whose listener takes connections and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        yield silent.getsockname()[1]


def _dicom_outbox(rows: OutboxStore, port: int) -> Outbox:
    scu = StoreSCU(
        "RADSERVE",
        connect_timeout_s=TIMEOUT_S,
        acse_timeout_s=TIMEOUT_S,
        dimse_timeout_s=TIMEOUT_S,
        network_timeout_s=TIMEOUT_S,
    )
    policy = RetryPolicy(first_delay_s=DELAY.total_seconds(), max_delay_s=60)
    return Outbox(rows, [Destination("pacs", "PACS", "127.0.0.1", port)], scu, policy=policy)


def test_a_dicom_retry_is_due_its_back_off_after_the_attempt_ended(
    store: Store, hung: int, tmp_path: Path
) -> None:
    rows = OutboxStore(store.engine)
    outbox = _dicom_outbox(rows, hung)
    [item] = outbox.enqueue(small_study(tmp_path / "results", slices=range(10, 11)), now=T0)
    report = outbox.deliver_pending(T0)  # waits out the association timeout
    assert (report.claimed, report.retried) == (1, 1)
    row = rows.get(item.id)
    assert row.state is OutboxState.PENDING and row.attempts == 1
    assert "no answer to the association request" in (row.last_error or ""), row.last_error
    # recorded when the attempt ended (pynetdicom waited TIMEOUT_S), due DELAY after that
    assert row.updated >= T0 + dt.timedelta(seconds=TIMEOUT_S), row.updated
    assert row.next_attempt_at == row.updated + DELAY
    # so not due again at the time the old code set (the claim plus the back-off)
    assert outbox.deliver_pending(T0 + DELAY).claimed == 0
    assert outbox.deliver_pending(row.next_attempt_at).claimed == 1


def test_a_fhir_retry_is_due_its_back_off_after_the_post_timed_out(store: Store) -> None:
    rows = OutboxStore(store.engine)
    fhir = FhirServer()
    fhir.up()
    try:
        fhir.script(Answer(200, delay_s=4 * TIMEOUT_S))  # answers long after the timeout
        box = FhirOutbox(
            rows,
            FhirDestination(url=fhir.url, timeout_s=TIMEOUT_S),
            policy=RetryPolicy(first_delay_s=DELAY.total_seconds(), max_delay_s=60),
        )
        bundle = {"resourceType": "Bundle", "id": "b-1", "type": "transaction", "entry": []}
        item = box.enqueue(bundle, folder=Path(store.engine.url.database).parent, now=T0)
        assert box.deliver_pending(T0).retried == 1
        row = rows.get(item.id)
        assert row.state is OutboxState.PENDING and row.kind is OutboxKind.FHIR
        assert row.updated >= T0 + dt.timedelta(seconds=TIMEOUT_S), row.updated
        assert row.next_attempt_at == row.updated + DELAY
    finally:
        fhir.down()


def test_a_destination_whose_retry_hangs_is_failing_and_unreachable(
    store: Store, hung: int, tmp_path: Path
) -> None:
    rows = OutboxStore(store.engine)
    outbox = _dicom_outbox(rows, hung)
    outbox.enqueue(small_study(tmp_path / "results", slices=range(10, 12)), now=T0)
    outbox.deliver_pending(T0)  # the first attempt: both rows fail, retried later
    [first] = rows.status()
    assert first.retrying == 2 and first.failing_since == T0 and first.last_error
    # the next attempt claims them (as the destination's sender does) and hangs in the
    # association request: the rows are "sending", the PACS still as hung as before
    later = max(r.next_attempt_at for r in rows.items())
    claimed = rows.claim_due(later, scope=None)
    assert len(claimed) == 2 and {r.state for r in rows.items()} == {OutboxState.SENDING}
    [status] = rows.status()
    assert (status.sending, status.retrying) == (2, 2), status
    assert status.failing_since == T0
    assert status.last_error == first.last_error  # why, while the retry hangs
    settings = load_settings(None, outbox__unreachable_after_s=60)
    ops = OutboxOps(settings, store, clock=lambda: later + dt.timedelta(minutes=5))
    unreachable = ops.unreachable()
    assert list(unreachable) == ["pacs"], unreachable
    assert "2 delivery(ies) failing" in unreachable["pacs"]
