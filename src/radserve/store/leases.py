"""Job leases: which replica runs an unfinished job, and for how long it may.

Several radserve replicas share one database. The replica that accepts a job holds
its lease from the job's creation (``jobs.lease_owner`` = ``<instance id>/<incarnation>``,
``jobs.lease_expires``) and renews every lease it holds while it lives
(:meth:`LeaseMixin.renew_leases`). Another replica takes a job over
(:meth:`LeaseMixin.claim_jobs`, ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL)
only once its lease has expired: the job goes back to ``queued`` under the new owner,
and the outbox rows the old owner held for it (deliveries of a result it never
recorded) are deleted in the same transaction.

What makes a job produce exactly one result is the fence, not the clock: the writes of
a run -- ``running``, ``failed``, the result -- carry the writer's owner and match only
while the row still names it (:class:`LeaseLostError` otherwise), so a replica that was
merely slow (paused, cut off) and comes back after a take-over writes nothing. Its
result files went to a folder of its own (see :func:`result_folder_name`).

With SQLite (one server, the embedded default) the server holds every lease: at start
it claims every unfinished job, as restart recovery always did.

Another incarnation of this replica's own instance id is its predecessor -- whose jobs
it takes back at once -- only if that incarnation's last renewal came before this one
began (:attr:`Lease.since`). One that renews after it is alive: a second server started
with the same ``outbox.instance_id`` (a copied config, a frozen VM started again
elsewhere). Its jobs are judged like another replica's (taken once their lease expired
and ``may_take`` agrees), and :meth:`LeaseMixin.twins` names it. Before, the two took
each other's jobs at every poll, and every job failed within seconds
(``job_duplicate``, ``lease_lost``) while ``/readyz`` said ready.

On PostgreSQL every lease time is the database's clock (:mod:`radserve.store.db_clock`:
this host's clock plus its measured offset), so a replica whose clock is off neither
takes live leases nor keeps dead ones. A server alone (``outbox.replicas`` 1) on a
PostgreSQL database whose jobs other servers hold under live leases refuses to start
(:meth:`LeaseMixin.check_alone`) rather than take them all. A server that stops cleanly
lets its leases go (:meth:`LeaseMixin.release_leases`): the others take its jobs at
their next poll instead of a lease later.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, delete, or_, select, update
from sqlalchemy.orm import Session

from radserve.audit.events import Action, job_event
from radserve.store import audit as audit_log
from radserve.store import jobs as jobq
from radserve.store.base import StoreBase
from radserve.store.db_clock import DbClock
from radserve.store.errors import InvalidTransitionError, StoreError
from radserve.store.models import Job, OutboxDelivery
from radserve.store.records import JobRecord, JobState, utc_now

logger = logging.getLogger(__name__)

UNFINISHED = (JobState.RECEIVED.value, JobState.QUEUED.value, JobState.RUNNING.value)
HELD = "held"  # outbox state of deliveries whose result is not recorded yet
# (another replica's last renewal, its lease's length) -> whether it may be taken over
MayTake = Callable[[dt.datetime, dt.timedelta], bool]


class LeaseLostError(InvalidTransitionError):
    """The job's lease passed to another replica: this replica's run of it is void."""

    code = "lease_lost"
    retryable = False


class ReplicasNotConfiguredError(StoreError):
    """A server configured to run alone (``outbox.replicas`` 1) found other servers
    holding live job leases on its database: started, it would take all their jobs."""

    code = "replicas_not_configured"
    retryable = False


@dataclass(frozen=True)
class Lease:
    """This process's identity as a lease holder, and how long a lease lasts."""

    owner: str  # "<instance id>/<incarnation>"
    duration: dt.timedelta
    # when this incarnation began (this host's clock; :attr:`began` in the database's):
    # another incarnation of the instance that renewed its leases after it is a live
    # second server with the same instance id, no predecessor
    since: dt.datetime = field(default_factory=utc_now)
    # the database's clock, in which the lease times are written and compared (measured
    # with each renewal and claim on PostgreSQL; SQLite: this host's)
    clock: DbClock = field(default_factory=DbClock, compare=False, repr=False)

    @classmethod
    def new(
        cls,
        instance: str,
        seconds: float,
        *,
        since: dt.datetime | None = None,
        clock: DbClock | None = None,
    ) -> Lease:
        """A new incarnation of ``instance`` (each server start is one)."""
        owner = f"{instance}/{uuid.uuid4().hex[:12]}"
        clock = clock or DbClock()
        return cls(owner, dt.timedelta(seconds=seconds), since or clock.local(), clock)

    @property
    def began(self) -> dt.datetime:
        """:attr:`since` in the database's clock."""
        return self.clock.to_database(self.since)

    @property
    def instance(self) -> str:
        return self.owner.rsplit("/", 1)[0]

    @property
    def incarnation(self) -> str:
        return self.owner.rsplit("/", 1)[-1]

    def until(self, now: dt.datetime) -> dt.datetime:
        return now + self.duration

    def columns(self, now: dt.datetime) -> dict[str, Any]:
        """The job row's lease columns for this lease granted or renewed at ``now``: the
        renewal time is stored so other replicas know this lease's length."""
        return {"lease_owner": self.owner, "lease_renewed": now, "lease_expires": self.until(now)}

    def grant(self, row: Job, now: dt.datetime) -> None:
        """Give ``row`` this lease from ``now`` (this host's clock, as the row's other
        times): from :attr:`clock`'s time instead once it measured the database's."""
        start = self.clock.now() if self.clock.measured else now
        for name, value in self.columns(start).items():
            setattr(row, name, value)


@dataclass(frozen=True)
class Claimed:
    """A job this replica took (back) at start or over from a replica whose lease expired."""

    record: JobRecord
    previous_owner: str | None
    previous_state: str
    # claimed with replicas sharing the database (a previous incarnation of this
    # instance may then be a live second server, still writing its result folder)
    shared: bool = False

    @property
    def handed_over(self) -> bool:
        """Whether it was another server's (not this instance's earlier incarnation)."""
        if self.previous_owner is None:
            return False
        current = (self.record.lease_owner or "").rsplit("/", 1)[0]
        return self.previous_owner.rsplit("/", 1)[0] != current


def result_folder_name(job_id: str, claimed: Claimed | None, lease: Lease) -> str:
    """The job's result folder name: ``<job id>``, or ``<job id>.<incarnation>`` for a
    job taken over from another replica, which may still be writing into ``<job id>``
    -- with replicas, from another incarnation of this instance too (a second server
    with the same instance id, or a frozen one started again elsewhere, writes on)."""
    if claimed is not None and (
        claimed.handed_over
        or (claimed.shared and claimed.previous_owner not in (None, lease.owner))
    ):
        return f"{job_id}.{lease.incarnation}"
    return job_id


class LeaseMixin(StoreBase):
    """Lease operations of :class:`radserve.store.Store`."""

    def renew_leases(self, lease: Lease, *, now: dt.datetime | None = None) -> set[str]:
        """Extend every lease ``lease.owner`` holds on an unfinished job; returns their ids
        (a job this replica runs and that is not among them was taken over or finished
        elsewhere). ``now``: the database's time (default: :attr:`Lease.clock`'s, whose
        offset this renewal measures)."""
        with self._write(audited=False) as session:
            now = _lease_now(session, lease, now)
            rows = session.execute(
                update(Job)
                .where(Job.lease_owner == lease.owner, Job.state.in_(UNFINISHED))
                .values(**lease.columns(now))
                .returning(Job.id)
                .execution_options(synchronize_session=False)
            ).all()
        return {row[0] for row in rows}

    def claim_jobs(
        self,
        lease: Lease,
        *,
        shared: bool,
        others: bool = True,
        now: dt.datetime | None = None,
        may_take: MayTake | None = None,
        limit: int | None = None,
        spare_live: bool = False,
    ) -> list[Claimed]:
        """Take unfinished jobs for ``lease.owner``, earliest deadline first: received
        and running ones go back to ``queued``; each is audited (``job.requeued`` with
        the reason and the previous owner). ``attempts`` is kept, so a study that kills
        every server that runs it reaches the retry limit instead of looping.

        ``shared`` (other replicas use this database): only jobs whose lease expired or
        that have none, and those of this instance's earlier incarnations; else every
        unfinished job (a single server owns them all). ``others`` False (with
        ``shared``): only this instance's own, for a replica that cannot tell yet whether
        an expired lease was let go or only not renewable (the database was away;
        :class:`radserve.service.leases.LeaseKeeper`). ``may_take`` (with ``others``):
        asked of each expired lease of another instance with its last renewal and its
        length, as the row says (a row leased before ``lease_renewed`` existed: expiry
        less this replica's lease); None: every expired lease is taken. ``limit``: at
        most that many taken (a lease ``may_take`` refused does not count).
        ``spare_live`` (with ``shared`` False): other instances' unexpired leases are left
        alone (a server alone on PostgreSQL: :meth:`check_alone` refused to start while
        other servers held live leases; this spares one that started since). ``now``: the
        database's time (default: :attr:`Lease.clock`'s, whose offset this claim
        measures)."""
        claimed: list[Claimed] = []
        passed: list[str] = []  # leases may_take refused: not counted toward ``limit``
        with self._write() as session:
            now = _lease_now(session, lease, now)
            query = _claimable(lease, now, shared=shared, others=others, spare_live=spare_live)
            while (wanted := None if limit is None else limit - len(claimed)) is None or wanted > 0:
                batch = query.where(Job.id.not_in(passed)) if passed else query
                rows = session.scalars(batch if wanted is None else batch.limit(wanted)).all()
                for row in rows:
                    if shared and may_take is not None and not _judged(row, lease, may_take):
                        passed.append(row.id)
                    else:  # its owner is now lease.owner, which the query excludes
                        claimed.append(_claim(session, row, lease, now, shared=shared))
                if wanted is None or len(rows) < wanted:
                    break
        if claimed:
            over = sum(1 for c in claimed if c.handed_over)
            logger.warning(
                "leases: %d unfinished job(s) claimed (%d taken over from other replicas)",
                len(claimed),
                over,
            )
        return claimed

    def release_leases(self, lease: Lease, *, now: dt.datetime | None = None) -> list[str]:
        """Let go of every lease ``lease.owner`` holds on an unfinished job, for a server
        that stops cleanly once it runs nothing any more: each becomes a lease of no
        length that ended ``now`` (the database's time; default :attr:`Lease.clock`'s),
        which the other replicas take at their next poll (``job.requeued``, ``reason:
        lease_released``) instead of a lease and a renewal interval later, and this
        instance's next incarnation at its start. Returns the jobs' ids."""
        with self._write(audited=False) as session:
            now = _lease_now(session, lease, now)
            rows = session.execute(
                update(Job)
                .where(Job.lease_owner == lease.owner, Job.state.in_(UNFINISHED))
                .values(lease_renewed=now, lease_expires=now)
                .returning(Job.id)
                .execution_options(synchronize_session=False)
            ).all()
        released = sorted(row[0] for row in rows)
        if released:
            logger.warning(
                "leases: %d unfinished job(s) released to the other replicas", len(released)
            )
        return released

    def live_owners(
        self, lease: Lease, *, now: dt.datetime | None = None
    ) -> dict[str, dt.datetime]:
        """Servers of other instances holding an unexpired lease (by the database's clock,
        ``now``) on an unfinished job, with their last renewal. ``lease``'s own instance is
        left out: at start, an incarnation of it whose lease runs is a crashed predecessor
        (same host name) as often as a live twin, and a restart must not be refused."""
        with self._read() as session:
            now = _lease_now(session, lease, now)
            rows = session.execute(
                select(Job.lease_owner, Job.lease_renewed, Job.lease_expires).where(
                    Job.state.in_(UNFINISHED),
                    Job.lease_owner.is_not(None),
                    Job.lease_expires > now,
                    ~_own_instance(lease),
                )
            ).all()
        found: dict[str, dt.datetime] = {}
        for owner, renewed, expires in rows:
            last = renewed or expires - lease.duration
            found[owner] = max(last, found.get(owner, last))
        return found

    def check_alone(self, lease: Lease, *, now: dt.datetime | None = None) -> None:
        """For a server about to hold every unfinished job alone (``outbox.replicas`` 1,
        ``claim_jobs(shared=False)``): raise :class:`ReplicasNotConfiguredError` where, on
        PostgreSQL, other servers hold live leases (:meth:`live_owners`) -- it would take
        all their jobs and void their runs. SQLite: never (one server: the data dir's
        lock, :mod:`radserve.store.data_dir_lock`)."""
        if self.dialect != "postgresql":
            return
        owners = self.live_owners(lease, now=now)
        if not owners:
            return
        at = now or lease.clock.now()
        named = ", ".join(
            f"{owner} (renewed {max(0.0, (at - renewed).total_seconds()):.0f} s ago)"
            for owner, renewed in sorted(owners.items())
        )
        raise ReplicasNotConfiguredError(
            f"other servers hold job leases on this database: {named}; this server is set "
            "to run alone (outbox.replicas: 1) and would take all their jobs. Set "
            "outbox.replicas to the number of servers sharing the database (2 or more) and "
            "a distinct outbox.instance_id on each, or stop the other servers (one stopped "
            "cleanly holds no lease; one that crashed holds its leases for jobs.lease_s)"
        )

    def twins(self, lease: Lease) -> dict[str, dt.datetime]:
        """Other incarnations of ``lease``'s instance that renewed a lease of an
        unfinished job after ``lease`` began, with their last renewal: each is a live
        second server started with the same instance id (its predecessors stopped
        renewing before)."""
        with self._read() as session:
            rows = session.execute(
                select(Job.lease_owner, Job.lease_renewed).where(
                    Job.state.in_(UNFINISHED),
                    _own_instance(lease),
                    Job.lease_owner != lease.owner,
                    Job.lease_renewed >= lease.began,
                )
            ).all()
        found: dict[str, dt.datetime] = {}
        for owner, renewed in rows:
            found[owner] = max(renewed, found.get(owner, renewed))
        return found


def _own_instance(lease: Lease) -> ColumnElement[bool]:
    """Rows leased by any incarnation of ``lease``'s instance."""
    return Job.lease_owner.like(f"{_escape_like(lease.instance)}/%", escape="\\")


def _lease_now(session: Session, lease: Lease, now: dt.datetime | None) -> dt.datetime:
    """``now`` (the database's time, given), or the lease clock's, measured in
    ``session`` first (PostgreSQL)."""
    lease.clock.measure(session)
    return now or lease.clock.now()


def _claimable(
    lease: Lease, now: dt.datetime, *, shared: bool, others: bool, spare_live: bool = False
) -> Select[Any]:
    """The unfinished jobs :meth:`LeaseMixin.claim_jobs` may take, earliest deadline
    first, locked (rows another transaction holds are skipped)."""
    query = (
        select(Job)
        .where(
            Job.state.in_(UNFINISHED),
            or_(Job.lease_owner.is_(None), Job.lease_owner != lease.owner),
        )
        .order_by(Job.deadline, Job.arrival, Job.id)
        .with_for_update(skip_locked=True)
    )
    own = _predecessor_of(lease)
    alone = not shared and spare_live
    if alone:
        own = _own_instance(lease)  # every job of this instance is this server's alone
    if (shared and others) or alone:
        return query.where(
            or_(
                Job.lease_owner.is_(None),
                Job.lease_expires.is_(None),
                Job.lease_expires < now,
                own,
            )
        )
    if shared:
        return query.where(own)
    return query


def _predecessor_of(lease: Lease) -> ColumnElement[bool]:
    """Rows leased by an earlier incarnation of ``lease``'s instance that last renewed
    before ``lease`` began (or never recorded a renewal): taken back at once."""
    return and_(
        _own_instance(lease),
        or_(Job.lease_renewed.is_(None), Job.lease_renewed < lease.began),
    )


def _claim(
    session: Session, row: Job, lease: Lease, now: dt.datetime, *, shared: bool = False
) -> Claimed:
    """``row`` taken for ``lease``: queued, its held deliveries deleted, audited."""
    previous_owner, previous_state = row.lease_owner, row.state
    released = row.lease_renewed is not None and row.lease_renewed == row.lease_expires
    row.state = JobState.QUEUED.value
    for name, value in lease.columns(now).items():  # ``now`` is the database's time
        setattr(row, name, value)
    row.updated = now
    session.flush()
    session.execute(
        delete(OutboxDelivery).where(OutboxDelivery.job_id == row.id, OutboxDelivery.state == HELD)
    )
    record = jobq.to_record(row)
    item = Claimed(record, previous_owner, previous_state, shared)
    if not item.handed_over:
        reason = "restart_recovery"
    elif released:  # its owner stopped cleanly and let it go (release_leases)
        reason = "lease_released"
    else:
        reason = "lease_expired"
    extra: dict[str, Any] = {"reason": reason, "previous_state": previous_state}
    if previous_owner is not None:
        extra["previous_owner"] = previous_owner
    audit_log.append(session, job_event(Action.JOB_REQUEUED, record, extra=extra))
    return item


def _judged(row: Job, lease: Lease, may_take: MayTake) -> bool:
    """Whether ``may_take`` lets ``lease`` take ``row`` (always: no lease, or its own
    instance's)."""
    if row.lease_owner is None or row.lease_expires is None:
        return True
    if row.lease_owner.rsplit("/", 1)[0] == lease.instance and (
        row.lease_renewed is None or row.lease_renewed < lease.began
    ):
        return True  # its predecessor's (a live twin's is judged like another replica's)
    renewed = row.lease_renewed or row.lease_expires - lease.duration
    return may_take(renewed, row.lease_expires - renewed)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


__all__ = [
    "HELD",
    "Claimed",
    "Lease",
    "LeaseLostError",
    "LeaseMixin",
    "MayTake",
    "ReplicasNotConfiguredError",
    "result_folder_name",
]
