"""The outbox for operators: what is waiting or failing, per destination, and the
"send it again" action (``radserve outbox``, ``/v1/ops/outbox``, metrics, ``/readyz``).

A retry is audited (``outbox.retried``: who, which row, the state it had; for a
``committing`` row also the storage commitment transaction it stops waiting for). A destination
counts as unreachable once its oldest delivery that has failed and is still retrying was
queued more than ``outbox.unreachable_after_s`` ago.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from radserve.audit import Action, AuditEvent
from radserve.config import Settings
from radserve.store import Store
from radserve.store.outbox import (
    DestinationStatus,
    OutboxItem,
    OutboxKind,
    OutboxState,
    OutboxStore,
)

logger = logging.getLogger(__name__)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# how often a destination's sender looks for due rows when nothing wakes it (one server)
LANE_INTERVAL_S = 30.0


def lane_interval_s(settings: Settings) -> float:
    """How often each destination's sender looks without being woken: with replicas,
    ``outbox.lane_poll_s`` (rows other replicas queued wake no sender here, and a
    replica not sending to a destination tries to take it over that often)."""
    if settings.outbox.replicas > 1:
        return settings.outbox.lane_poll_s
    return LANE_INTERVAL_S


class OutboxOps:
    """Read and re-arm the outbox of the store ``store``; ``wake`` nudges the senders."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.settings = settings
        self.store = store
        self.rows = OutboxStore(store.engine, instance=settings.outbox.instance_id)
        self.wake = wake
        self.clock = clock

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
        return out


__all__ = ["OutboxOps"]
