"""Audit chain persistence: serialised appends, and reading the chain back for verify/export.

Appends are serialised twice over: a process-wide lock in :class:`Store` (cheap, avoids
lock waits in the database) and, in the database, the chain-head row — ``SELECT ...
FOR UPDATE`` on PostgreSQL, the ``BEGIN IMMEDIATE`` write lock on SQLite — so processes
sharing one database (API, workers, CLI) cannot link two records to one predecessor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Dialect, bindparam, insert, literal_column, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from radserve.audit.chain import AuditEvent, AuditKey, AuditRecord, canonical_json, record_hash
from radserve.store.errors import StoreError
from radserve.store.models import AuditEntry, AuditHead
from radserve.store.records import utc_now

_PAGE = 500
# built once: composing a statement cost more CPU than executing it (a batch is 3 of them)
_HEAD = AuditHead.__table__.c
_ONE = literal_column("1")  # the head's id in the SQL itself: no parameter to pass
_LOCK_HEAD = select(_HEAD.seq, _HEAD.hash).where(_HEAD.id == _ONE).with_for_update()
_INSERT = insert(AuditEntry.__table__)
_MOVE_HEAD = (
    update(AuditHead.__table__)
    .where(_HEAD.id == _ONE)
    .values(seq=bindparam("new_seq"), hash=bindparam("new_hash"))
)
_ENTRY_COLUMNS = tuple(c.name for c in AuditEntry.__table__.c)


@dataclass(frozen=True)
class _DriverStatements:
    """The three statements of an append as the database driver takes them: the SQL
    compiled once per dialect by SQLAlchemy, each column's bind conversion (the
    ``UtcDateTime`` of ``ts``) taken from its type. Run on the transaction's own driver
    cursor: through ``Session.execute`` the statements' Python overhead was ~40 % of a
    one-record append's CPU (~500 of ~1,250 µs; the rest is SQLite's commit and fsync),
    and the audit writer process of the API readers does little else
    (docs/api-performance.md)."""

    lock: str
    insert: str
    move: str
    insert_keys: tuple[str, ...]
    move_keys: tuple[str, ...]
    positional: bool
    convert: dict[str, Callable[[Any], Any]]

    @classmethod
    def of(cls, dialect: Dialect) -> _DriverStatements:
        inserting = _INSERT.compile(dialect=dialect, column_keys=list(_ENTRY_COLUMNS))
        moving = _MOVE_HEAD.compile(dialect=dialect)
        convert = {}
        for column in AuditEntry.__table__.c:
            processor = column.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                convert[column.name] = processor
        return cls(
            lock=str(_LOCK_HEAD.compile(dialect=dialect)),
            insert=inserting.string,
            move=moving.string,
            insert_keys=tuple(inserting.positiontup or _ENTRY_COLUMNS),
            move_keys=tuple(moving.positiontup or ("new_seq", "new_hash")),
            positional=dialect.positional,
            convert=convert,
        )

    def params(self, keys: tuple[str, ...], values: dict[str, Any]) -> Any:
        convert = self.convert
        converted = {k: convert[k](values[k]) if k in convert else values[k] for k in keys}
        return tuple(converted[k] for k in keys) if self.positional else converted


_DRIVER: dict[str, _DriverStatements] = {}  # by dialect name

# session.info keys: the store's audit key, and the records appended in the transaction
KEY_INFO = "radserve_audit_key"
APPENDED_INFO = "radserve_audit_appended"
CHAIN_KEY_CHECK_INFO = "radserve_audit_chain_key_check"


class AuditKeyMissingError(StoreError):
    """This store has no audit key but the chain is keyed: its records would be forged."""

    code = "audit_key_missing"
    retryable = False


class AuditKeyMismatchError(StoreError):
    """This store's audit key is not the one the chain is keyed with: replicas sharing a
    database that each made a key of their own would write a chain none can verify."""

    code = "audit_key_mismatch"
    retryable = False


class ChainKeyCheck:
    """Whether this store's key was found to be the chain's: checked under the head lock
    at the store's first append (after it, a writer with another key is refused at its
    own first append), so it costs one query per store, not one per record."""

    def __init__(self) -> None:
        self.done = False


def append(session: Session, event: AuditEvent) -> AuditRecord:
    """Link ``event`` to the chain inside the caller's write transaction.

    The hash is keyed with the store's audit key (``session.info``); a store without
    one may only extend an unkeyed chain."""
    return append_many(session, [event])[0]


def append_many(session: Session, events: Sequence[AuditEvent]) -> list[AuditRecord]:
    """Link ``events``, in order, inside the caller's write transaction: the chain head
    is locked, read and written once and the rows go in one executemany, so a batch
    costs one round of statements rather than one per record (each record's hash still
    links to its predecessor's). Core statements, not ORM objects: the unit of work's
    bookkeeping per row cost more CPU than the hash and the insert together
    (docs/api-performance.md), and nothing reads these rows back in the transaction."""
    key: AuditKey | None = session.info.get(KEY_INFO)
    # what the transaction changed through the ORM goes first, as Session.execute's
    # autoflush did: row locks are then taken in the same order as before (the job's
    # row, then the chain head), and a failing row fails here
    session.flush()
    connection = session.connection()  # the write transaction (BEGIN IMMEDIATE) is begun
    dialect = connection.dialect
    sql = _DRIVER.get(dialect.name)
    if sql is None:
        sql = _DRIVER[dialect.name] = _DriverStatements.of(dialect)
    # closed however the append ends: a lock time-out, a constraint or an outage must not
    # leave a driver cursor open on the pooled connection
    dbapi = connection.connection.dbapi_connection
    with _as_sqlalchemy_errors(dialect), closing(dbapi.cursor()) as cursor:  # type: ignore[union-attr]
        cursor.execute(sql.lock)
        seq, prev_hash = cursor.fetchone()
        if key is None and seq > 0:
            _refuse_unkeyed_link(session, seq)
        check: ChainKeyCheck | None = session.info.get(CHAIN_KEY_CHECK_INFO)
        if key is not None and check is not None and not check.done:
            _refuse_foreign_key(session, seq, key)
            check.done = True
        records, rows = _linked(events, seq, prev_hash, key)
        if rows:
            cursor.executemany(sql.insert, [sql.params(sql.insert_keys, row) for row in rows])
            moved = {"new_seq": records[-1].seq, "new_hash": records[-1].hash}
            cursor.execute(sql.move, sql.params(sql.move_keys, moved))
    session.info.setdefault(APPENDED_INFO, []).extend(records)
    return records


@contextmanager
def _as_sqlalchemy_errors(dialect: Dialect) -> Iterator[None]:
    """The driver's own errors, raised through the raw cursor, as SQLAlchemy's (what
    SQLAlchemy's own execution raises): the store maps those (a database away or out
    of disk space is an outage, a 503, not an internal error)."""
    base = dialect.loaded_dbapi.Error
    try:
        yield
    except base as exc:
        raise sa_exc.DBAPIError.instance(None, None, exc, base, dialect=dialect) from exc


def _refuse_unkeyed_link(session: Session, seq: int) -> None:
    """A store without a key may not extend a chain whose newest record is keyed."""
    last_key = session.execute(
        select(AuditEntry.key_id).where(AuditEntry.seq == seq)
    ).scalar_one_or_none()
    if last_key is not None:
        raise AuditKeyMissingError(
            "the audit chain is keyed and this process has no audit key: set "
            "audit.key_file or RADSERVE_AUDIT__KEY as the server does"
        )


def key_id_at(session: Session, seq: int) -> str | None:
    """The key id record ``seq`` was hashed with (None: no such record, or unkeyed)."""
    if seq <= 0:
        return None
    return session.execute(
        select(AuditEntry.key_id).where(AuditEntry.seq == seq)
    ).scalar_one_or_none()


def _refuse_foreign_key(session: Session, seq: int, key: AuditKey) -> None:
    """The chain's newest record is keyed with another key than ``key``."""
    last_key = key_id_at(session, seq)
    if last_key is not None and last_key != key.id:
        raise AuditKeyMismatchError(
            f"the audit chain is keyed with audit key {last_key} and this process holds "
            f"audit key {key.id}: nothing was appended. Every server and command writing "
            "one chain uses the same key (a shared audit.key_file or RADSERVE_AUDIT__KEY)"
        )


def _linked(
    events: Sequence[AuditEvent], seq: int, prev_hash: str, key: AuditKey | None
) -> tuple[list[AuditRecord], list[dict[str, Any]]]:
    """``events`` as records linked after ``(seq, prev_hash)``, and as the rows to insert."""
    key_id = key.id if key is not None else None
    records: list[AuditRecord] = []
    rows: list[dict[str, Any]] = []
    for event in events:
        payload = json.loads(canonical_json(dict(event.payload)))  # JSON-able, or raise
        # The hashed fields, stored as they are (the payload as canonical JSON in the table).
        fields: dict[str, Any] = {
            "seq": seq + 1,
            "ts": utc_now(),
            "actor_key_id": event.actor_key_id,
            "client_address": event.client_address,
            "action": event.action,
            "subject": event.subject,
            "payload": payload,
        }
        digest = record_hash(prev_hash, key=key, **fields)
        records.append(AuditRecord(**fields, prev_hash=prev_hash, hash=digest, key_id=key_id))
        rows.append(
            {**fields, "payload": canonical_json(payload), "prev_hash": prev_hash}
            | {"hash": digest, "key_id": key_id}
        )
        seq, prev_hash = seq + 1, digest
    return records, rows


def head(session: Session) -> tuple[int, str]:
    row = session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one()
    return row.seq, row.hash


def iter_records(session: Session, after: int = 0) -> Iterator[tuple[int, str | None, AuditRecord]]:
    """Every stored record by seq (after ``after``), in pages, as ``(seq, unreadable
    reason or None, record)``."""
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
        converted = [(row.seq, *to_record(row)) for row in rows]
        session.expunge_all()  # keep memory flat on long chains
        yield from converted


def to_record(row: AuditEntry) -> tuple[str | None, AuditRecord]:
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
        key_id=row.key_id,
    )
    return error, record
