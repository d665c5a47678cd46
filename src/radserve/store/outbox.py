"""The outbox table: results waiting for, being sent to, or delivered to their
destinations: DICOM instances to DICOM peers (kind ``dicom``), FHIR Bundles to a FHIR
server (kind ``fhir``). Each kind has its own sender; a sender claims only its kind.

Rows move ``pending -> sending -> sent`` or ``-> pending`` (retry later) or
``-> failed_permanent`` (configuration error, or retries exhausted). Every change is a
conditional UPDATE in its own committed transaction, so:

- a row is claimed by exactly one worker (``pending`` and due -> ``sending``);
- a row is marked ``sent`` right after the peer's success status, before the next send;
- a worker that dies while ``sending`` leaves the row to be claimed again once its
  lease has expired, so the instance may be sent a second time (receivers treat a
  repeated SOP Instance UID as the same instance) but is never lost.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from radserve.store.base import StoreBase
from radserve.store.errors import StoreError
from radserve.store.models import OutboxDelivery


class OutboxState(StrEnum):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    FAILED_PERMANENT = "failed_permanent"


class OutboxKind(StrEnum):
    DICOM = "dicom"  # a DICOM instance to a DICOM peer (C-STORE)
    FHIR = "fhir"  # a FHIR Bundle to a FHIR server (HTTP POST)


@dataclass(frozen=True)
class NewDelivery:
    """What to enqueue: one result file for one destination (by its configured name)."""

    destination: str
    path: str
    sop_class_uid: str
    sop_instance_uid: str
    study_instance_uid: str
    transfer_syntax_uid: str
    job_id: str | None = None
    kind: OutboxKind = OutboxKind.DICOM


@dataclass(frozen=True)
class OutboxItem:
    """One outbox row as persisted (a frozen copy, never a live ORM object)."""

    id: int
    destination: str
    path: str
    sop_class_uid: str
    sop_instance_uid: str
    study_instance_uid: str
    transfer_syntax_uid: str
    job_id: str | None
    state: OutboxState
    attempts: int
    next_attempt_at: dt.datetime
    last_error: str | None
    created: dt.datetime
    updated: dt.datetime
    sent_at: dt.datetime | None
    kind: OutboxKind = OutboxKind.DICOM


class OutboxStore(StoreBase):
    """Typed access to ``outbox_deliveries``; share the engine of the main store:
    ``OutboxStore(store.engine)``. Thread-safe."""

    def add(self, deliveries: Sequence[NewDelivery], *, now: dt.datetime) -> list[OutboxItem]:
        """Enqueue (state ``pending``, due ``now``); an existing (instance, destination)
        row is kept as it is, so enqueueing twice never sends twice. Returns the rows."""
        if not deliveries:
            return []
        with self._write(audited=False) as session:
            dialect_insert = (
                postgresql.insert
                if session.get_bind().dialect.name == "postgresql"
                else sqlite.insert
            )
            for new in deliveries:
                session.execute(
                    dialect_insert(OutboxDelivery)
                    .values(
                        **_new_values(new),
                        state=OutboxState.PENDING.value,
                        attempts=0,
                        next_attempt_at=now,
                        created=now,
                        updated=now,
                    )
                    .on_conflict_do_nothing()
                )
            rows = [_find(session, new.sop_instance_uid, new.destination) for new in deliveries]
            return [_record(row) for row in rows]

    def claim_due(
        self,
        now: dt.datetime,
        *,
        limit: int = 100,
        lease: dt.timedelta = dt.timedelta(minutes=15),
        kind: OutboxKind = OutboxKind.DICOM,
    ) -> list[OutboxItem]:
        """Take up to ``limit`` due rows of ``kind`` for sending (oldest first): ``pending``
        rows whose time has come, and ``sending`` rows whose worker vanished (lease
        expired). Counts the attempt now, so a crash mid-send still counts."""
        stale = now - lease
        due = and_(
            OutboxDelivery.kind == OutboxKind(kind).value,
            or_(
                and_(
                    OutboxDelivery.state == OutboxState.PENDING.value,
                    OutboxDelivery.next_attempt_at <= now,
                ),
                and_(
                    OutboxDelivery.state == OutboxState.SENDING.value,
                    OutboxDelivery.updated <= stale,
                ),
            ),
        )
        claimed: list[OutboxItem] = []
        with self._write(audited=False) as session:
            ids = session.scalars(
                select(OutboxDelivery.id)
                .where(due)
                .order_by(OutboxDelivery.next_attempt_at, OutboxDelivery.id)
                .limit(limit)
            ).all()
            for item_id in ids:
                result = session.execute(
                    update(OutboxDelivery)
                    .where(OutboxDelivery.id == item_id, due)
                    .values(
                        state=OutboxState.SENDING.value,
                        attempts=OutboxDelivery.attempts + 1,
                        updated=now,
                    )
                )
                if getattr(result, "rowcount", 0) == 1:
                    claimed.append(_record(_get(session, item_id)))
        return claimed

    def mark_sent(self, item_id: int, *, now: dt.datetime) -> bool:
        """``sending -> sent``; False if the row was not ``sending`` (taken over after a
        lease expiry, or already marked)."""
        return self._move(item_id, OutboxState.SENT, now=now, sent_at=now, last_error=None)

    def reschedule(
        self, item_id: int, *, now: dt.datetime, next_attempt_at: dt.datetime, error: str
    ) -> bool:
        """``sending -> pending`` due at ``next_attempt_at``, keeping why it failed."""
        return self._move(
            item_id,
            OutboxState.PENDING,
            now=now,
            next_attempt_at=next_attempt_at,
            last_error=error,
        )

    def fail_permanently(self, item_id: int, *, now: dt.datetime, error: str) -> bool:
        """``sending -> failed_permanent``: needs a person (see :meth:`rearm`)."""
        return self._move(item_id, OutboxState.FAILED_PERMANENT, now=now, last_error=error)

    def rearm(
        self, *, now: dt.datetime, ids: Iterable[int] | None = None, destination: str | None = None
    ) -> int:
        """``failed_permanent -> pending`` (due now, attempts reset) after the cause was
        fixed, e.g. the PACS now knows radserve's AE title. Returns how many rows."""
        query = update(OutboxDelivery).where(
            OutboxDelivery.state == OutboxState.FAILED_PERMANENT.value
        )
        if ids is not None:
            query = query.where(OutboxDelivery.id.in_(list(ids)))
        if destination is not None:
            query = query.where(OutboxDelivery.destination == destination)
        with self._write(audited=False) as session:
            result = session.execute(
                query.values(
                    state=OutboxState.PENDING.value, attempts=0, next_attempt_at=now, updated=now
                )
            )
            return int(getattr(result, "rowcount", 0))

    def get(self, item_id: int) -> OutboxItem:
        with self._read() as session:
            return _record(_get(session, item_id))

    def items(
        self,
        *,
        state: OutboxState | str | None = None,
        destination: str | None = None,
        job_id: str | None = None,
        kind: OutboxKind | str | None = None,
        limit: int = 1000,
    ) -> list[OutboxItem]:
        """Rows in enqueue order, optionally filtered."""
        query = select(OutboxDelivery)
        if kind is not None:
            query = query.where(OutboxDelivery.kind == OutboxKind(kind).value)
        if state is not None:
            query = query.where(OutboxDelivery.state == OutboxState(state).value)
        if destination is not None:
            query = query.where(OutboxDelivery.destination == destination)
        if job_id is not None:
            query = query.where(OutboxDelivery.job_id == job_id)
        with self._read() as session:
            rows = session.scalars(query.order_by(OutboxDelivery.id).limit(limit)).all()
            return [_record(row) for row in rows]

    def counts(self) -> dict[OutboxState, int]:
        """Rows per state (every state present, zero included), e.g. for ``/metrics``."""
        with self._read() as session:
            rows = session.execute(
                select(OutboxDelivery.state, func.count()).group_by(OutboxDelivery.state)
            ).all()
        found = {str(state): int(count) for state, count in rows}
        return {state: int(found.get(state.value, 0)) for state in OutboxState}

    def next_due(self, kind: OutboxKind = OutboxKind.DICOM) -> dt.datetime | None:
        """When the earliest ``pending`` row of ``kind`` falls due (None: nothing pending)."""
        with self._read() as session:
            return session.scalar(
                select(func.min(OutboxDelivery.next_attempt_at)).where(
                    OutboxDelivery.state == OutboxState.PENDING.value,
                    OutboxDelivery.kind == OutboxKind(kind).value,
                )
            )

    def _move(
        self, item_id: int, state: OutboxState, *, now: dt.datetime, **values: object
    ) -> bool:
        with self._write(audited=False) as session:
            result = session.execute(
                update(OutboxDelivery)
                .where(
                    OutboxDelivery.id == item_id,
                    OutboxDelivery.state == OutboxState.SENDING.value,
                )
                .values(state=state.value, updated=now, **values)
            )
            return getattr(result, "rowcount", 0) == 1


def _new_values(new: NewDelivery) -> dict[str, object]:
    return {
        "destination": new.destination,
        "path": new.path,
        "sop_class_uid": new.sop_class_uid,
        "sop_instance_uid": new.sop_instance_uid,
        "study_instance_uid": new.study_instance_uid,
        "transfer_syntax_uid": new.transfer_syntax_uid,
        "job_id": new.job_id,
        "kind": OutboxKind(new.kind).value,
    }


def _find(session: Session, sop_instance_uid: str, destination: str) -> OutboxDelivery:
    row = session.scalars(
        select(OutboxDelivery).where(
            OutboxDelivery.sop_instance_uid == sop_instance_uid,
            OutboxDelivery.destination == destination,
        )
    ).one()
    return row


def _get(session: Session, item_id: int) -> OutboxDelivery:
    row = session.get(OutboxDelivery, item_id)
    if row is None:
        raise StoreError(f"no outbox row {item_id}", code="outbox_item_not_found")
    return row


def _record(row: OutboxDelivery) -> OutboxItem:
    return OutboxItem(
        id=row.id,
        destination=row.destination,
        path=row.path,
        sop_class_uid=row.sop_class_uid,
        sop_instance_uid=row.sop_instance_uid,
        study_instance_uid=row.study_instance_uid,
        transfer_syntax_uid=row.transfer_syntax_uid,
        job_id=row.job_id,
        state=OutboxState(row.state),
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        last_error=row.last_error,
        created=row.created,
        updated=row.updated,
        sent_at=row.sent_at,
        kind=OutboxKind(row.kind),
    )
