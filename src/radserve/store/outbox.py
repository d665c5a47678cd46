"""The outbox table: results waiting for, being sent to, or delivered to their
destinations: DICOM instances to DICOM peers (kind ``dicom``), FHIR Bundles to a FHIR
server (kind ``fhir``). Each kind has its own sender; a sender claims only its kind.

Rows move ``pending -> sending -> sent`` or ``-> pending`` (retry later) or
``-> failed_permanent`` (configuration error, or retries exhausted). To a destination
with storage commitment a stored row waits ``committing`` (its Transaction UID kept)
until the destination's report or the deadline takes it back to ``sending`` to be
settled like any send (radserve.gateway.commitment). Every change is a
conditional UPDATE in its own committed transaction, so:

- a row is claimed by exactly one worker (``pending`` and due -> ``sending``);
- a row is marked ``sent`` right after the peer's success status, before the next send;
- a worker that dies while ``sending`` leaves the row to be claimed again once its
  lease has expired, so the instance may be sent a second time (receivers treat a
  repeated SOP Instance UID as the same instance) but is never lost;
- each claim records its owner (``<instance id>/<incarnation>``): a restarted server
  takes back at start (:meth:`OutboxStore.reclaim`) the rows its previous incarnation
  left ``sending`` -- every such row when it is the only server on the database, the
  rows of its own instance id when several replicas share it -- instead of waiting for
  their leases (meant for replicas that may still be sending) to run out.

Every time the senders write into a row or compare with one -- a row's due time, its
lease's renewal (``updated``) and the stale cut-off of a claim, a storage commitment's
deadline -- is the database's on PostgreSQL (:meth:`OutboxStore.now`: this host's clock
plus its offset from the database's, measured as the job leases measure theirs,
:mod:`radserve.store.db_clock`), since rows are written by one replica and judged by
another. Before, each replica used its own clock: with replicas two minutes apart, one
behind took the other's ``sending`` rows while they were being sent (sent twice), one
ahead left a dead sender's rows for two minutes more than their lease, and rows queued
by a replica whose clock ran ahead waited that long before any sender found them due.
"""

from __future__ import annotations

import datetime as dt
import math
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import ColumnElement, Engine, Update, and_, case, func, or_, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from radserve.domain.priority import PriorityClass
from radserve.store.base import StoreBase
from radserve.store.db_clock import DbClock
from radserve.store.errors import OutboxItemNotFoundError, OutboxNotRetryableError
from radserve.store.leases import LeaseLostError
from radserve.store.models import Job, OutboxCommitmentRequest, OutboxDelivery

# A delivery's rank by its job's class (rows of no job, or of a purged one, as routine).
_CLASS_ORDER = case(
    *((Job.priority_class == cls.value, cls.rank) for cls in PriorityClass),
    else_=PriorityClass.OUTPATIENT.rank,
)


class OutboxState(StrEnum):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    FAILED_PERMANENT = "failed_permanent"
    # a delivery of a result not yet recorded: recording it releases the row (pending),
    # a take-over of its job by another replica deletes it (radserve.store.leases)
    HELD = "held"
    # stored by a destination with storage commitment, its commitment report awaited
    # until ``next_attempt_at`` (radserve.gateway.commitment)
    COMMITTING = "committing"


class OutboxKind(StrEnum):
    DICOM = "dicom"  # a DICOM instance to a DICOM peer (C-STORE)
    FHIR = "fhir"  # a FHIR Bundle to a FHIR server (HTTP POST)
    CRITICAL = "critical"  # a critical-finding notice to a webhook (JSON POST)


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
    # the job lease owner whose result this is: the row is ``held`` until that owner
    # records the result (None: ``pending`` at once)
    held_for: str | None = None


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
    lease_owner: str | None = None
    commitment_uid: str | None = None  # the storage commitment transaction (committing)


@dataclass(frozen=True)
class Scope:
    """Which destinations' rows a sender takes: ``destination``'s (any if None), none
    of ``other_than`` (the lane of destinations no longer configured)."""

    destination: str | None = None
    other_than: tuple[str, ...] = ()

    def clause(self) -> ColumnElement[bool]:
        column = OutboxDelivery.destination
        return and_(
            true() if self.destination is None else column == self.destination,
            column.not_in(self.other_than) if self.other_than else true(),
        )


@dataclass(frozen=True)
class Settlement:
    """What one attempt recorded on its ``sending`` row: its new state at ``now`` and the
    columns that go with it (:meth:`OutboxStore.settle_all`)."""

    item_id: int
    state: OutboxState
    now: dt.datetime
    values: Mapping[str, object] = field(default_factory=dict)
    # the row's attempt count when this attempt claimed it (each claim adds one): a
    # sender whose lease ran out while it waited on a slow peer settles nothing once
    # another has claimed the row again (None: any attempt)
    attempt: int | None = None

    @classmethod
    def sent(
        cls,
        item_id: int,
        *,
        now: dt.datetime,
        warning: str | None = None,
        attempt: int | None = None,
    ) -> Settlement:
        values = {"sent_at": now, "last_error": warning}
        return cls(item_id, OutboxState.SENT, now, values, attempt)

    @classmethod
    def retry(
        cls,
        item_id: int,
        *,
        now: dt.datetime,
        due: dt.datetime,
        error: str,
        attempt: int | None = None,
    ) -> Settlement:
        values = {"next_attempt_at": due, "last_error": error}
        return cls(item_id, OutboxState.PENDING, now, values, attempt)

    @classmethod
    def failed(
        cls, item_id: int, *, now: dt.datetime, error: str, attempt: int | None = None
    ) -> Settlement:
        return cls(item_id, OutboxState.FAILED_PERMANENT, now, {"last_error": error}, attempt)


@dataclass(frozen=True)
class DestinationStatus:
    """How deliveries to one destination stand (for operators: CLI, API, metrics)."""

    kind: OutboxKind
    destination: str
    pending: int  # waiting for their (next) attempt
    sending: int
    failed_permanent: int
    retrying: int  # pending rows that failed at least once
    oldest_pending: dt.datetime | None  # queued time of the oldest pending/sending row
    failing_since: dt.datetime | None  # queued time of the oldest retrying row
    last_error: str | None  # of the most recently failed retrying or failed row
    committing: int = 0  # stored, the destination's storage commitment awaited


@dataclass(frozen=True)
class StalledLane:
    """A destination whose deliveries are due and that no sender makes progress on
    (:meth:`OutboxStore.stalled`): none of its rows was claimed, renewed or settled since
    ``after_s`` before now, while some have been due longer than that."""

    kind: OutboxKind
    destination: str
    waiting: int  # rows due for longer than the bound (pending, or a commitment expired)
    due_since: dt.datetime  # when the oldest of them fell due
    last_progress: dt.datetime | None  # the latest claim, renewal or outcome of its rows


# how long a measured offset of the database's clock is used before it is measured again
# (a step of this host's clock is corrected within it)
REMEASURE_S = 10.0


def instance_id(configured: str | None = None) -> str:
    """This server's stable name among replicas: the configured one, else the host name."""
    return configured or socket.gethostname()


class OutboxStore(StoreBase):
    """Typed access to ``outbox_deliveries``; share the engine of the main store:
    ``OutboxStore(store.engine)``. Thread-safe.

    ``instance``: this server's instance id (:func:`instance_id`); each store object is a
    new incarnation, recorded with it on every lease it takes (:attr:`owner`).

    ``clock``: the database's clock as this host reads it (:meth:`now`; a seam for tests:
    ``DbClock(local=...)`` is a host whose clock is off). The job leases' clock warns of
    an offset beyond its bound; this one, by default, does not say it again."""

    def __init__(
        self, engine: Engine, *, instance: str | None = None, clock: DbClock | None = None
    ) -> None:
        super().__init__(engine)
        self.instance = instance_id(instance)
        self.owner = f"{self.instance}/{uuid.uuid4().hex[:12]}"
        self.clock = clock or DbClock(bound_s=math.inf)
        self._measured_at: float | None = None  # monotonic time of the last measurement

    def now(self) -> dt.datetime:
        """The database's time now (PostgreSQL: this host's clock plus its offset from the
        database's, measured again at most every :data:`REMEASURE_S`; SQLite: this host's):
        the time every outbox row is written and judged in, by every replica alike."""
        if self.dialect == "postgresql" and (
            self._measured_at is None or time.monotonic() - self._measured_at >= REMEASURE_S
        ):
            with self._read() as session:
                self.clock.measure(session)
            self._measured_at = time.monotonic()
        return self.clock.now()

    def add(self, deliveries: Sequence[NewDelivery], *, now: dt.datetime) -> list[OutboxItem]:
        """Enqueue (state ``pending``, due ``now``; ``held`` with ``held_for``); an
        existing (instance, destination) row is kept as it is, so enqueueing twice never
        sends twice -- except a row still held for another lease owner, which the new
        owner's result takes over. Returns the rows."""
        if not deliveries:
            return []
        with self._write(audited=False) as session:
            _fence_held(session, deliveries)
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
                        state=(OutboxState.HELD if new.held_for else OutboxState.PENDING).value,
                        lease_owner=new.held_for,
                        attempts=0,
                        next_attempt_at=now,
                        created=now,
                        updated=now,
                    )
                    .on_conflict_do_nothing()
                )
            rows = [_find(session, new.sop_instance_uid, new.destination) for new in deliveries]
            for new, row in zip(deliveries, rows, strict=True):
                if (
                    new.held_for
                    and row.state == OutboxState.HELD.value
                    and row.lease_owner != new.held_for
                ):
                    row.lease_owner, row.path, row.updated = new.held_for, new.path, now
            session.flush()
            return [_record(row) for row in rows]

    def claim_due(
        self,
        now: dt.datetime,
        *,
        limit: int = 100,
        lease: dt.timedelta = dt.timedelta(minutes=15),
        kind: OutboxKind = OutboxKind.DICOM,
        scope: Scope | None = None,
    ) -> list[OutboxItem]:
        """Take up to ``limit`` due rows of ``kind`` for sending: ``pending`` rows whose
        time has come, and ``sending`` rows whose worker vanished (lease expired). Counts
        the attempt now, so a crash mid-send still counts. ``scope``: only those
        destinations' rows (a sender of its own per destination).

        Best class first (the job's: URGENT, then INPATIENT, then OUTPATIENT and rows of
        no job), then oldest first: an URGENT study's results do not queue behind a
        backlog of routine ones."""
        stale = now - lease
        due = and_(
            OutboxDelivery.kind == OutboxKind(kind).value,
            (scope or Scope()).clause(),
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
        with self._write(audited=False) as session:
            ids = session.scalars(
                select(OutboxDelivery.id)
                .outerjoin(Job, Job.id == OutboxDelivery.job_id)
                .where(due)
                .order_by(_CLASS_ORDER, OutboxDelivery.next_attempt_at, OutboxDelivery.id)
                .limit(limit)
            ).all()
            if not ids:
                return []
            # one statement for the batch, not an UPDATE and a SELECT per row: the rows
            # still due when it runs (another sender may have taken some meanwhile)
            taken = set(
                session.scalars(
                    update(OutboxDelivery)
                    .where(OutboxDelivery.id.in_(ids), due)
                    .values(
                        state=OutboxState.SENDING.value,
                        attempts=OutboxDelivery.attempts + 1,
                        updated=now,
                        lease_owner=self.owner,
                    )
                    .returning(OutboxDelivery.id)
                    .execution_options(synchronize_session=False),
                ).all()
            )
            rows = session.scalars(
                select(OutboxDelivery)
                .where(OutboxDelivery.id.in_(taken))
                .execution_options(populate_existing=True)
            ).all()
            by_id = {row.id: _record(row) for row in rows}
        return [by_id[item_id] for item_id in ids if item_id in by_id]

    def renew(self, items: Sequence[OutboxItem], *, now: dt.datetime) -> set[int]:
        """Renew the lease of ``items`` (claimed by this store) from ``now``: each row still
        ``sending`` under this owner and the attempt that claimed it. The ids renewed; a
        row missing was settled meanwhile or taken over by another sender
        (:class:`radserve.gateway.lease_keeper.LeaseKeeper`)."""
        if not items:
            return set()
        claims = [
            and_(OutboxDelivery.id == item.id, OutboxDelivery.attempts == item.attempts)
            for item in items
        ]
        with self._write(audited=False) as session:
            renewed = session.scalars(
                update(OutboxDelivery)
                .where(
                    or_(*claims),
                    OutboxDelivery.state == OutboxState.SENDING.value,
                    OutboxDelivery.lease_owner == self.owner,
                )
                .values(updated=now)
                .returning(OutboxDelivery.id)
                .execution_options(synchronize_session=False)
            ).all()
        return set(renewed)

    def reclaim(self, *, now: dt.datetime, shared: bool) -> int:
        """At start, before any sender runs: rows a previous incarnation left ``sending``
        become ``pending`` and due ``now`` (their attempt still counts). ``shared``
        (other replicas use this database): only rows leased under this instance id;
        else every ``sending`` row, since no other server can be sending it."""
        query = update(OutboxDelivery).where(
            OutboxDelivery.state == OutboxState.SENDING.value,
            or_(OutboxDelivery.lease_owner.is_(None), OutboxDelivery.lease_owner != self.owner),
        )
        if shared:
            query = query.where(
                OutboxDelivery.lease_owner.like(f"{_escape_like(self.instance)}/%", escape="\\")
            )
        return self._requeue(query, now, "interrupted by a restart while sending; sent again")

    def take_over_lane(self, *, kind: OutboxKind, scope: Scope, now: dt.datetime) -> int:
        """A lane that has just taken its destination's lock
        (:mod:`radserve.store.lane_lock`): the rows of ``scope`` left ``sending`` under
        another owner become ``pending``, due ``now`` (their attempt still counts). Only
        the lock's holder sends them, so whoever claimed them is gone (killed, or cut off
        from the database and stopped). Returns how many rows."""
        query = update(OutboxDelivery).where(
            OutboxDelivery.kind == OutboxKind(kind).value,
            scope.clause(),
            OutboxDelivery.state == OutboxState.SENDING.value,
            or_(OutboxDelivery.lease_owner.is_(None), OutboxDelivery.lease_owner != self.owner),
        )
        why = "its sender stopped while sending (destination taken over); sent again"
        return self._requeue(query, now, why)

    def _requeue(self, query: Update, now: dt.datetime, why: str) -> int:
        """The ``sending`` rows ``query`` selects become ``pending``, due ``now``."""
        with self._write(audited=False) as session:
            result = session.execute(
                query.values(
                    state=OutboxState.PENDING.value,
                    next_attempt_at=now,
                    updated=now,
                    lease_owner=None,
                    last_error=why,
                )
            )
            return int(getattr(result, "rowcount", 0))

    def settle_all(self, settlements: Sequence[Settlement]) -> list[bool]:
        """Record several attempts' outcomes in one transaction (one commit, one fsync on
        SQLite, for what a sender had acknowledged meanwhile); each row moves only from
        ``sending``, and, for a settlement that names its ``attempt``, only while no later
        attempt has claimed it. Per settlement: whether its row moved (False: taken over
        after a lease expiry, or already settled: a late answer of the first sender no
        longer overwrites the attempt of the one that took the row over). A ``sent`` row's
        ``warning`` (the peer stored it with a warning status, e.g. 0xB000, coerced) is
        kept in ``last_error`` for an operator."""
        moved = []
        with self._write(audited=False) as session:
            for s in settlements:
                query = update(OutboxDelivery).where(
                    OutboxDelivery.id == s.item_id,
                    OutboxDelivery.state == OutboxState.SENDING.value,
                )
                if s.attempt is not None:
                    query = query.where(OutboxDelivery.attempts == s.attempt)
                result = session.execute(
                    query.values(state=s.state.value, updated=s.now, lease_owner=None, **s.values)
                )
                moved.append(getattr(result, "rowcount", 0) == 1)
        return moved

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

    def retry(self, item_id: int, *, now: dt.datetime) -> tuple[OutboxItem, OutboxState]:
        """An operator's "send it again": a ``failed_permanent`` row becomes ``pending``
        (attempts reset, due now); a ``pending`` row becomes due now; a ``committing``
        row stops waiting for its storage commitment report and becomes ``pending``, due
        now (attempts kept): it is stored again and asked under a new transaction (a
        report of the abandoned one still counts: radserve.gateway.commitment_ledger).
        Returns the row and the state it had. Raises ``outbox_item_not_found`` or
        ``outbox_not_retryable`` (a row being sent, or already sent)."""
        with self._write(audited=False) as session:
            row = _get(session, item_id)
            previous = OutboxState(row.state)
            values: dict[str, object] = {"next_attempt_at": now, "updated": now}
            if previous is OutboxState.FAILED_PERMANENT:
                values.update(state=OutboxState.PENDING.value, attempts=0)
            elif previous is OutboxState.COMMITTING:
                values.update(
                    state=OutboxState.PENDING.value,
                    last_error=(
                        f"retried by an operator while its storage commitment (transaction "
                        f"{row.commitment_uid}) was awaited: stored again, new transaction"
                    ),
                )
            elif previous is not OutboxState.PENDING:
                raise OutboxNotRetryableError(
                    f"outbox row {item_id} is {previous.value}: only pending, committing or "
                    "failed_permanent deliveries can be retried"
                )
            result = session.execute(
                update(OutboxDelivery)
                .where(OutboxDelivery.id == item_id, OutboxDelivery.state == previous.value)
                .values(**values)
            )
            if getattr(result, "rowcount", 0) != 1:
                raise OutboxNotRetryableError(f"outbox row {item_id} changed meanwhile; look again")
            session.expire_all()
            return _record(_get(session, item_id)), previous

    def status(self) -> list[DestinationStatus]:
        """Per (kind, destination) that has undelivered rows or had any: counts, the
        oldest undelivered row's queue time, since when deliveries fail, the last error."""
        undelivered = (
            OutboxState.PENDING.value,
            OutboxState.SENDING.value,
            OutboxState.COMMITTING.value,
        )
        # a row that failed and waits for its next attempt, or is in it: a destination
        # that hangs (each attempt waits out a timeout) keeps its rows "sending" most of
        # the time, and counting pending rows only left it never failing (/readyz never
        # degraded for a SIGSTOPped PACS; the destination's last error blank)
        failing = and_(
            OutboxDelivery.state.in_((OutboxState.PENDING.value, OutboxState.SENDING.value)),
            OutboxDelivery.attempts > 0,
            OutboxDelivery.last_error.is_not(None),
        )
        key = (OutboxDelivery.kind, OutboxDelivery.destination)
        with self._read() as session:
            counts = session.execute(
                select(*key, OutboxDelivery.state, func.count()).group_by(
                    *key, OutboxDelivery.state
                )
            ).all()
            oldest = dict(
                ((kind, name), created)
                for kind, name, created in session.execute(
                    select(*key, func.min(OutboxDelivery.created))
                    .where(OutboxDelivery.state.in_(undelivered))
                    .group_by(*key)
                ).all()
            )
            retrying = {
                (kind, name): (int(n), since)
                for kind, name, n, since in session.execute(
                    select(*key, func.count(), func.min(OutboxDelivery.created))
                    .where(failing)
                    .group_by(*key)
                ).all()
            }
            by_key: dict[tuple[str, str], dict[str, int]] = {}
            for kind, name, state, n in counts:
                by_key.setdefault((kind, name), {})[state] = int(n)
            out = []
            for (kind, name), states in sorted(by_key.items()):
                n_retrying, since = retrying.get((kind, name), (0, None))
                last_error = session.scalar(
                    select(OutboxDelivery.last_error)
                    .where(
                        OutboxDelivery.kind == kind,
                        OutboxDelivery.destination == name,
                        or_(failing, OutboxDelivery.state == OutboxState.FAILED_PERMANENT.value),
                    )
                    .order_by(OutboxDelivery.updated.desc(), OutboxDelivery.id.desc())
                    .limit(1)
                )
                out.append(
                    DestinationStatus(
                        kind=OutboxKind(kind),
                        destination=name,
                        pending=states.get(OutboxState.PENDING.value, 0),
                        sending=states.get(OutboxState.SENDING.value, 0),
                        failed_permanent=states.get(OutboxState.FAILED_PERMANENT.value, 0),
                        committing=states.get(OutboxState.COMMITTING.value, 0),
                        retrying=n_retrying,
                        oldest_pending=oldest.get((kind, name)),
                        failing_since=since,
                        last_error=last_error,
                    )
                )
            return out

    def stalled(self, *, now: dt.datetime, after_s: float) -> list[StalledLane]:
        """Destinations with rows due for more than ``after_s`` at ``now`` and no sign of a
        sender since: no row of theirs claimed, renewed (a batch going out) or settled
        within ``after_s``. A lane whose sender runs claims its due rows within its poll,
        and one busy with a long batch renews and settles rows as it goes; rows waiting
        with neither have no sender (every replica's lane for it stopped, or the one
        holding its lock frozen and not yet ended: :mod:`radserve.store.lane_lock`).
        Queueing new rows is no progress: their ``attempts`` is 0."""
        cutoff = now - dt.timedelta(seconds=after_s)
        key = (OutboxDelivery.kind, OutboxDelivery.destination)
        with self._read() as session:
            waiting = session.execute(
                select(*key, func.count(), func.min(OutboxDelivery.next_attempt_at))
                .where(
                    OutboxDelivery.state.in_(
                        (OutboxState.PENDING.value, OutboxState.COMMITTING.value)
                    ),
                    OutboxDelivery.next_attempt_at <= cutoff,
                )
                .group_by(*key)
                .order_by(*key)
            ).all()
            out = []
            for kind, name, n, due_since in waiting:
                last = session.scalar(
                    select(func.max(OutboxDelivery.updated)).where(
                        OutboxDelivery.kind == kind,
                        OutboxDelivery.destination == name,
                        OutboxDelivery.state != OutboxState.HELD.value,
                        or_(
                            OutboxDelivery.state != OutboxState.PENDING.value,
                            OutboxDelivery.attempts > 0,
                        ),
                    )
                )
                if last is not None and last > cutoff:
                    continue
                out.append(StalledLane(OutboxKind(kind), name, int(n), due_since, last))
            return out

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

    def next_due(
        self, kind: OutboxKind = OutboxKind.DICOM, scope: Scope | None = None
    ) -> dt.datetime | None:
        """When the earliest ``pending`` row of ``kind`` (in ``scope``, if given) falls
        due, or a ``committing`` row's wait for its commitment ends (None: neither)."""
        where = [
            OutboxDelivery.state.in_((OutboxState.PENDING.value, OutboxState.COMMITTING.value)),
            OutboxDelivery.kind == OutboxKind(kind).value,
            (scope or Scope()).clause(),
        ]
        with self._read() as session:
            return session.scalar(select(func.min(OutboxDelivery.next_attempt_at)).where(*where))

    def await_commitment(
        self, ids: Sequence[int], *, transaction_uid: str, now: dt.datetime, deadline: dt.datetime
    ) -> int:
        """``sending -> committing`` under ``transaction_uid`` until ``deadline``
        (``next_attempt_at``), committed before the N-ACTION goes out so a report
        arriving after a restart finds its rows. Returns how many rows."""
        with self._write(audited=False) as session:
            result = session.execute(
                update(OutboxDelivery)
                .where(
                    OutboxDelivery.id.in_(list(ids)),
                    OutboxDelivery.state == OutboxState.SENDING.value,
                )
                .values(
                    state=OutboxState.COMMITTING.value,
                    commitment_uid=transaction_uid,
                    next_attempt_at=deadline,
                    updated=now,
                    lease_owner=None,
                )
            )
            asked = session.scalars(
                select(OutboxDelivery.id).where(
                    OutboxDelivery.id.in_(list(ids)),
                    OutboxDelivery.commitment_uid == transaction_uid,
                )
            ).all()
            session.add_all(
                OutboxCommitmentRequest(
                    transaction_uid=transaction_uid, delivery_id=item_id, requested_at=now
                )
                for item_id in asked
            )
            return int(getattr(result, "rowcount", 0))

    def committing(self, transaction_uid: str) -> list[OutboxItem]:
        """The rows still awaiting ``transaction_uid``'s commitment report."""
        with self._read() as session:
            rows = session.scalars(
                select(OutboxDelivery)
                .where(
                    OutboxDelivery.state == OutboxState.COMMITTING.value,
                    OutboxDelivery.commitment_uid == transaction_uid,
                )
                .order_by(OutboxDelivery.id)
            ).all()
            return [_record(row) for row in rows]

    def requested(self, transaction_uid: str) -> list[OutboxItem]:
        """Every row ``transaction_uid``'s N-ACTION asked about, in whatever state it is
        now (empty: radserve never asked for this transaction)."""
        with self._read() as session:
            rows = session.scalars(
                select(OutboxDelivery)
                .join(
                    OutboxCommitmentRequest,
                    OutboxCommitmentRequest.delivery_id == OutboxDelivery.id,
                )
                .where(OutboxCommitmentRequest.transaction_uid == transaction_uid)
                .order_by(OutboxDelivery.id)
            ).all()
            return [_record(row) for row in rows]

    def commit_late(
        self, item_id: int, *, transaction_uid: str, now: dt.datetime, note: str
    ) -> bool:
        """A report of ``transaction_uid`` that came after its deadline lists the row
        committed: ``sent`` (``note`` kept in ``last_error``) unless it is already sent,
        or a newer transaction of its own has since failed it (``pending`` or
        ``failed_permanent`` under another Transaction UID: the newer word wins). A
        ``pending`` re-send not yet made is cancelled; one being made or made
        (``sending``, ``committing``) is overtaken, its later outcome finding the row
        ``sent``. False if the row was not moved."""
        later = OutboxDelivery.state.in_((OutboxState.SENDING.value, OutboxState.COMMITTING.value))
        cancelled = and_(
            OutboxDelivery.state.in_(
                (OutboxState.PENDING.value, OutboxState.FAILED_PERMANENT.value)
            ),
            OutboxDelivery.commitment_uid == transaction_uid,
        )
        with self._write(audited=False) as session:
            result = session.execute(
                update(OutboxDelivery)
                .where(OutboxDelivery.id == item_id, or_(later, cancelled))
                .values(
                    state=OutboxState.SENT.value,
                    sent_at=now,
                    updated=now,
                    lease_owner=None,
                    last_error=note,
                )
            )
            return getattr(result, "rowcount", 0) == 1

    def take_committing(
        self,
        *,
        now: dt.datetime,
        transaction_uid: str | None = None,
        overdue: bool = False,
        scope: Scope | None = None,
    ) -> list[OutboxItem]:
        """``committing -> sending`` (leased here), to be settled as any send is: the
        rows of ``transaction_uid`` (its report arrived), or ``overdue`` ones (no report
        by their deadline) in ``scope``. Each row is taken once, whichever comes first."""
        where = [OutboxDelivery.state == OutboxState.COMMITTING.value, (scope or Scope()).clause()]
        if transaction_uid is not None:
            where.append(OutboxDelivery.commitment_uid == transaction_uid)
        if overdue:
            where.append(OutboxDelivery.next_attempt_at <= now)
        taken: list[OutboxItem] = []
        with self._write(audited=False) as session:
            ids = session.scalars(select(OutboxDelivery.id).where(*where)).all()
            for item_id in ids:
                result = session.execute(
                    update(OutboxDelivery)
                    .where(OutboxDelivery.id == item_id, *where)
                    .values(state=OutboxState.SENDING.value, updated=now, lease_owner=self.owner)
                )
                if getattr(result, "rowcount", 0) == 1:
                    taken.append(_record(_get(session, item_id)))
        return taken


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _fence_held(session: Session, deliveries: Sequence[NewDelivery]) -> None:
    """Held rows are a run's deliveries, written before its result: like the run's other
    writes they are fenced by its job lease. The job row is read ``FOR SHARE``, so a
    take-over (``FOR UPDATE SKIP LOCKED``, which deletes the held rows) either comes
    after this transaction and deletes them, or came before and this run is refused
    (:class:`LeaseLostError`). Unfenced, a run that lost its job during a database
    outage queued its bundle after the take-over, and the row stayed held for good."""
    owners = {new.job_id: new.held_for for new in deliveries if new.held_for and new.job_id}
    for job_id, owner in owners.items():
        current = session.execute(
            select(Job.lease_owner).where(Job.id == job_id).with_for_update(read=True)
        ).scalar_one_or_none()
        if current != owner:
            raise LeaseLostError(
                f"job {job_id} is held by another replica now ({current}); this run's "
                "deliveries are not queued"
            )


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
        raise OutboxItemNotFoundError(f"no outbox row {item_id}")
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
        lease_owner=row.lease_owner,
        commitment_uid=row.commitment_uid,
    )
