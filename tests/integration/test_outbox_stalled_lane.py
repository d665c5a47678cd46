"""Deliveries that wait with no sender making progress are named by ``/readyz``
(:meth:`radserve.service.outbox.OutboxOps.unreachable`, :meth:`OutboxStore.stalled`).

Before, only rows that had failed and were retrying counted: a replica frozen while it
held the FHIR lane left 30 Bundles pending, never attempted, for 45 s while ``/readyz``
answered 200 with no reason and every replica's ``radserve_outbox_sender{fhir}`` was 0.
Now rows due for longer than the bound, with none of their destination's rows claimed,
renewed or settled meanwhile, make the destination a degraded reason; new rows queued
meanwhile are no progress, a sender busy with a batch is."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.postgres import store_on
from tests.factories.service import settings_for
from tests.factories.waits import WAIT_SCALE

from radserve.config import load_settings
from radserve.service import Service
from radserve.service.outbox import OutboxOps, stall_bound_s
from radserve.store import Store
from radserve.store.outbox import NewDelivery, OutboxKind, OutboxStore, Settlement

NOW = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
BOUND_S = 60.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_outbox_stalled") as opened:
        yield opened


def _bundle(uid: str, destination: str = "fhir") -> NewDelivery:
    return NewDelivery(
        destination=destination,
        path=f"/results/{uid}.json",
        sop_class_uid="",
        sop_instance_uid=uid,
        study_instance_uid="1.2.3",
        transfer_syntax_uid="",
        kind=OutboxKind.FHIR,
    )


def _ops(store: Store, at: dt.datetime) -> OutboxOps:
    settings = load_settings(None, outbox__unreachable_after_s=900)
    return OutboxOps(settings, store, clock=lambda: at, stalled_after_s=BOUND_S)


def test_rows_nobody_sends_are_a_reason_after_the_bound_and_not_before(store: Store) -> None:
    rows = OutboxStore(store.engine, instance="frozen")
    rows.add([_bundle(f"1.{i}") for i in range(30)], now=NOW)

    assert _ops(store, NOW + dt.timedelta(seconds=BOUND_S - 1)).unreachable() == {}
    late = NOW + dt.timedelta(seconds=BOUND_S + 15)
    reasons = _ops(store, late).unreachable()
    assert list(reasons) == ["fhir"], reasons
    why = reasons["fhir"]
    assert "fhir destination fhir not being sent to: 30 delivery(ies) due for up to 75 s" in why
    assert "never attempted" in reasons["fhir"]
    # rows queued meanwhile are no progress: still named
    rows.add([_bundle("2.1")], now=late)
    assert list(_ops(store, late).unreachable()) == ["fhir"]
    [stalled] = rows.stalled(now=late, after_s=BOUND_S)
    assert (stalled.kind, stalled.destination, stalled.waiting) == (OutboxKind.FHIR, "fhir", 30)
    assert stalled.last_progress is None

    # a sender that claims and settles rows is progress, however many still wait
    taker = OutboxStore(store.engine, instance="live")
    [first] = taker.claim_due(late, limit=1, kind=OutboxKind.FHIR)
    assert _ops(store, late).unreachable() == {}
    assert taker.settle_all([Settlement.sent(first.id, now=late, attempt=first.attempts)])
    assert _ops(store, late + dt.timedelta(seconds=BOUND_S - 1)).unreachable() == {}
    # ... until it too stops for longer than the bound
    stuck = late + dt.timedelta(seconds=BOUND_S + 5)
    reasons = _ops(store, stuck).unreachable()
    assert "none claimed or settled for 65 s" in reasons["fhir"], reasons


def test_rows_waiting_for_their_retry_are_not_stalled(store: Store) -> None:
    rows = OutboxStore(store.engine, instance="a")
    rows.add([_bundle("1.1", "ehr")], now=NOW)
    [claimed] = rows.claim_due(NOW, kind=OutboxKind.FHIR)
    due = NOW + dt.timedelta(minutes=10)  # its back-off: not due, nobody need try it
    rows.settle_all([Settlement.retry(claimed.id, now=NOW, due=due, error="503")])
    assert _ops(store, NOW + dt.timedelta(minutes=8)).unreachable() == {}
    # due, and no sender came for it: named (before its failures make it unreachable)
    reasons = _ops(store, due + dt.timedelta(seconds=BOUND_S + 1)).unreachable()
    assert list(reasons) == ["ehr"] and "not being sent to" in reasons["ehr"]


def test_readyz_names_a_destination_whose_rows_no_sender_takes(tmp_path: Path) -> None:
    """Through :meth:`Service.readiness` (``/readyz``): degraded, still ready, with the
    reason; the default bound comes from the settings (lane poll, peer timeouts)."""
    settings = settings_for(tmp_path)  # no FHIR server configured: no FHIR sender here
    bound = stall_bound_s(settings)
    assert bound == max(60.0, 10.0 + 30.0 + 60.0, 30.0) + 30.0  # one server: 30 s looks
    service = Service(settings)
    rows = OutboxStore(service.store.engine)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=bound + 30)
    rows.add([_bundle(f"1.{i}") for i in range(3)], now=old)
    service.start()
    try:
        assert service.wait_warm(60 * WAIT_SCALE)
        state = service.readiness()
        assert state.ready and state.degraded, state.reasons
        assert list(state.unreachable_peers) == ["fhir"]
        assert any(
            "fhir destination fhir not being sent to: 3 delivery(ies)" in why
            for why in state.reasons
        ), state.reasons
    finally:
        service.stop()
