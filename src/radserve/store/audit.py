"""Audit chain persistence: serialised appends, and reading the chain back for verify/export.

Appends are serialised twice over: a process-wide lock in :class:`Store` (cheap, avoids
lock waits in the database) and, in the database, the chain-head row — ``SELECT ...
FOR UPDATE`` on PostgreSQL, the ``BEGIN IMMEDIATE`` write lock on SQLite — so processes
sharing one database (API, workers, CLI) cannot link two records to one predecessor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from radserve.audit.chain import AuditEvent, AuditRecord, canonical_json, record_hash
from radserve.store.models import AuditEntry, AuditHead
from radserve.store.records import utc_now

_PAGE = 500


def append(session: Session, event: AuditEvent) -> AuditRecord:
    """Link ``event`` to the chain inside the caller's write transaction."""
    head = session.execute(
        select(AuditHead).where(AuditHead.id == 1).with_for_update()
    ).scalar_one()
    # The hashed fields, stored as they are (the payload as canonical JSON in the table).
    fields: dict[str, Any] = {
        "seq": head.seq + 1,
        "ts": utc_now(),
        "actor_key_id": event.actor_key_id,
        "client_address": event.client_address,
        "action": event.action,
        "subject": event.subject,
        "payload": json.loads(canonical_json(dict(event.payload))),  # JSON-able, or raise here
    }
    prev_hash = head.hash
    record = AuditRecord(**fields, prev_hash=prev_hash, hash=record_hash(prev_hash, **fields))
    stored = {**fields, "payload": canonical_json(record.payload)}
    session.add(AuditEntry(**stored, prev_hash=prev_hash, hash=record.hash))
    head.seq, head.hash = record.seq, record.hash
    session.flush()
    return record


def head(session: Session) -> tuple[int, str]:
    row = session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one()
    return row.seq, row.hash


def iter_records(session: Session) -> Iterator[tuple[int, str | None, AuditRecord]]:
    """Every stored record by seq, in pages, as ``(seq, unreadable reason or None, record)``."""
    after = 0
    while True:
        rows = (
            session.execute(
                select(AuditEntry)
                .where(AuditEntry.seq > after)
                .order_by(AuditEntry.seq)
                .limit(_PAGE)
            )
            .scalars()
            .all()
        )
        if not rows:
            return
        after = rows[-1].seq
        converted = [(row.seq, *_to_record(row)) for row in rows]
        session.expunge_all()  # keep memory flat on long chains
        yield from converted


def _to_record(row: AuditEntry) -> tuple[str | None, AuditRecord]:
    error: str | None = None
    try:
        payload = json.loads(row.payload)
        if not isinstance(payload, dict):
            raise ValueError("payload is not a JSON object")
    except ValueError as exc:
        error, payload = f"payload is not valid JSON: {exc.__class__.__name__}", {}
    record = AuditRecord(
        seq=row.seq,
        ts=row.ts,
        actor_key_id=row.actor_key_id,
        client_address=row.client_address,
        action=row.action,
        subject=row.subject,
        payload=payload,
        prev_hash=row.prev_hash,
        hash=row.hash,
    )
    return error, record
