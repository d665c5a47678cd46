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
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, or_, select, update
from sqlalchemy.orm import Session

from radserve.audit.events import Action, job_event
from radserve.store import audit as audit_log
from radserve.store import jobs as jobq
from radserve.store.base import StoreBase
from radserve.store.errors import InvalidTransitionError
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


@dataclass(frozen=True)
class Lease:
    """This process's identity as a lease holder, and how long a lease lasts."""

    owner: str  # "<instance id>/<incarnation>"
    duration: dt.timedelta
    # when this incarnation began: another incarnation of the instance that renewed its
    # leases after it is a live second server with the same instance id, no predecessor
    since: dt.datetime = field(default_factory=utc_now)

    @classmethod
    def new(cls, instance: str, seconds: float, *, since: dt.datetime | None = None) -> Lease:
        """A new incarnation of ``instance`` (each server start is one)."""
        owner = f"{instance}/{uuid.uuid4().hex[:12]}"
        return cls(owner, dt.timedelta(seconds=seconds), since or utc_now())

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
        """Give ``row`` this lease from ``now``."""
        for name, value in self.columns(now).items():
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
        elsewhere)."""
        now = now or utc_now()
        with self._write(audited=False) as session:
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
        most that many taken (a lease ``may_take`` refused does not count)."""
        now = now or utc_now()
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
        if shared and others:
            query = query.where(
                or_(
                    Job.lease_owner.is_(None),
                    Job.lease_expires.is_(None),
                    Job.lease_expires < now,
                    own,
                )
            )
        elif shared:
            query = query.where(own)
        claimed: list[Claimed] = []
        passed: list[str] = []  # leases may_take refused: not counted toward ``limit``
        with self._write() as session:
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
                    Job.lease_renewed >= lease.since,
                )
            ).all()
        found: dict[str, dt.datetime] = {}
        for owner, renewed in rows:
            found[owner] = max(renewed, found.get(owner, renewed))
        return found


def _own_instance(lease: Lease) -> ColumnElement[bool]:
    """Rows leased by any incarnation of ``lease``'s instance."""
    return Job.lease_owner.like(f"{_escape_like(lease.instance)}/%", escape="\\")


def _predecessor_of(lease: Lease) -> ColumnElement[bool]:
    """Rows leased by an earlier incarnation of ``lease``'s instance that last renewed
    before ``lease`` began (or never recorded a renewal): taken back at once."""
    return and_(
        _own_instance(lease),
        or_(Job.lease_renewed.is_(None), Job.lease_renewed < lease.since),
    )


def _claim(
    session: Session, row: Job, lease: Lease, now: dt.datetime, *, shared: bool = False
) -> Claimed:
    """``row`` taken for ``lease``: queued, its held deliveries deleted, audited."""
    previous_owner, previous_state = row.lease_owner, row.state
    row.state = JobState.QUEUED.value
    lease.grant(row, now)
    row.updated = now
    session.flush()
    session.execute(
        delete(OutboxDelivery).where(OutboxDelivery.job_id == row.id, OutboxDelivery.state == HELD)
    )
    record = jobq.to_record(row)
    item = Claimed(record, previous_owner, previous_state, shared)
    reason = "lease_expired" if item.handed_over else "restart_recovery"
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
        row.lease_renewed is None or row.lease_renewed < lease.since
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
    "result_folder_name",
]
