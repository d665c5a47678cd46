"""The outbox for operators: what is waiting or failing, per destination, and the
"send it again" action (``radserve outbox``, ``/v1/ops/outbox``, metrics, ``/readyz``).

A retry is audited (``outbox.retried``: who, which row, the state it had; for a
``committing`` row also the storage commitment transaction it stops waiting for). A destination
counts as unreachable once its oldest delivery that has failed and is still retrying was
queued more than ``outbox.unreachable_after_s`` ago.

A destination also counts once its deliveries wait with no sender making progress: rows
due for longer than :func:`stall_bound_s` and none of its rows claimed, renewed or
settled meanwhile (:meth:`OutboxStore.stalled`). Failing rows are retried and so counted
by the rule above only after they failed; these are rows nobody tries (before, a replica
frozen while holding a destination's lane lock left 30 FHIR Bundles waiting with
``/readyz`` 200 and no reason given: :mod:`radserve.store.lane_lock`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from radserve.audit import Action, AuditEvent
from radserve.config import Settings
from radserve.store import Store
from radserve.store.lane_lock import SILENT_AFTER_S
from radserve.store.outbox import (
    DestinationStatus,
    OutboxItem,
    OutboxKind,
    OutboxState,
    OutboxStore,
)

logger = logging.getLogger(__name__)


# how often a destination's sender looks for due rows when nothing wakes it (one server)
LANE_INTERVAL_S = 30.0


def lane_interval_s(settings: Settings) -> float:
    """How often each destination's sender looks without being woken: with replicas,
    ``outbox.lane_poll_s`` (rows other replicas queued wake no sender here, and a
    replica not sending to a destination tries to take it over that often)."""
    if settings.outbox.replicas > 1:
        return settings.outbox.lane_poll_s
    return LANE_INTERVAL_S


def stall_bound_s(settings: Settings) -> float:
    """How long due deliveries may wait with no progress before ``/readyz`` names their
    destination: longer than a frozen lane holder is left before another server ends it
    and takes over (twice :data:`~radserve.store.lane_lock.SILENT_AFTER_S`), and than
    one attempt to a peer that hangs (DICOM: connect + ACSE + DIMSE timeouts; FHIR: its
    timeout), plus one look of the senders (:func:`lane_interval_s`): 105 s by default
    with replicas."""
    gateway = settings.gateway
    attempt = gateway.connect_timeout_s + gateway.acse_timeout_s + gateway.dimse_timeout_s
    attempt = max(attempt, settings.fhir.timeout_s)
    return max(2 * SILENT_AFTER_S, attempt) + lane_interval_s(settings)


class OutboxOps:
    """Read and re-arm the outbox of the store ``store``; ``wake`` nudges the senders.
    ``stalled_after_s``: see :func:`stall_bound_s` (the default)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], dt.datetime] | None = None,
        stalled_after_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.rows = OutboxStore(store.engine, instance=settings.outbox.instance_id)
        self.wake = wake
        # the rows' time: the database's (default), as the senders write and judge them
        self.clock = clock or self.rows.now
        self.stalled_after_s = (
            stall_bound_s(settings) if stalled_after_s is None else stalled_after_s
        )

    def items(
        self,
        *,
        state: OutboxState | str | None = None,
        destination: str | None = None,
        job_id: str | None = None,
        kind: OutboxKind | str | None = None,
        limit: int = 100,
    ) -> list[OutboxItem]:
        return self.rows.items(
            state=state, destination=destination, job_id=job_id, kind=kind, limit=limit
        )

    def status(self) -> list[DestinationStatus]:
        return self.rows.status()

    def retry(self, item_id: int, *, actor_key_id: str | None, client: str | None) -> OutboxItem:
        """Re-arm one delivery (see :meth:`OutboxStore.retry`), audit it, wake senders."""
        item, previous = self.rows.retry(item_id, now=self.clock())
        self.store.append_audit(
            AuditEvent(
                action=Action.OUTBOX_RETRIED,
                subject=str(item.id),
                payload={
                    "kind": item.kind.value,
                    "destination": item.destination,
                    "job_id": item.job_id,
                    "previous_state": previous.value,
                    # a committing row's abandoned storage commitment transaction
                    **(
                        {"commitment_uid": item.commitment_uid}
                        if previous is OutboxState.COMMITTING
                        else {}
                    ),
                },
                actor_key_id=actor_key_id,
                client_address=client,
            )
        )
        logger.info(
            "outbox: row %d to %s re-armed (was %s)", item.id, item.destination, previous.value
        )
        self.wake()
        return item

    def unreachable(self, statuses: list[DestinationStatus] | None = None) -> dict[str, str]:
        """Destinations failing for longer than ``outbox.unreachable_after_s``, and critical
        receivers with notices that failed for good (at once: a critical finding nobody
        will be told of until a person acts): name -> what to tell an operator."""
        threshold = self.settings.outbox.unreachable_after_s
        now = self.clock()
        out = {}
        for status in self.status() if statuses is None else statuses:
            if status.kind is OutboxKind.CRITICAL and status.failed_permanent:
                out[status.destination] = (
                    f"critical receiver {status.destination}: {status.failed_permanent} "
                    "notice(s) failed permanently and wait for an operator to fix the "
                    f"receiver and rearm them (last error: {status.last_error})"
                )
                continue
            if threshold <= 0 or status.failing_since is None:
                continue
            age = (now - status.failing_since).total_seconds()
            if age > threshold:
                out[status.destination] = (
                    f"{status.kind.value} destination {status.destination} unreachable: "
                    f"{status.retrying} delivery(ies) failing for {age:.0f} s "
                    f"(last error: {status.last_error})"
                )
        for lane in self.rows.stalled(now=now, after_s=self.stalled_after_s):
            waited = (now - lane.due_since).total_seconds()
            last = "never attempted"
            if lane.last_progress is not None:
                idle = (now - lane.last_progress).total_seconds()
                last = f"none claimed or settled for {idle:.0f} s"
            out.setdefault(
                lane.destination,
                f"{lane.kind.value} destination {lane.destination} not being sent to: "
                f"{lane.waiting} delivery(ies) due for up to {waited:.0f} s, {last} (no "
                "sender makes progress on them: every replica's sender for it stopped, or "
                "one holding its lane is frozen)",
            )
        return out


__all__ = ["OutboxOps", "lane_interval_s", "stall_bound_s"]
