"""Deadline misses, and which of them a deadline-risk event announced and how early.

Derived from what the store holds already — each job's deadline and end, and the risk
events' audit records (``job.deadline_risk``, ``job.deadline_risk_cleared``, subject the
job id) — rather than counted in a server's memory: the figure survives a restart and
is the same on every replica, with no table of its own. A miss is a job that passed its
deadline (finished after it, or unfinished now; cancelled jobs are not counted, as in a
job's ``deadline_missed``); it was *predicted* when the last risk event about it at or
before its deadline was a raise, and its lead is the deadline minus that raise's time.
A *false alert* is the other side (session 20): a job that ended by its deadline (not
cancelled) with a risk raised for it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from radserve.audit.events import Action
from radserve.domain.priority import PriorityClass
from radserve.store.base import StoreBase
from radserve.store.models import AuditEntry, Job

_RISK_ACTIONS = (Action.JOB_DEADLINE_RISK.value, Action.JOB_DEADLINE_RISK_CLEARED.value)
_CHUNK = 500  # job ids per IN (...) list


@dataclass(frozen=True)
class MissRecord:
    """One job that passed its deadline; ``lead_s`` None: no risk event stood for it."""

    job_id: str
    priority_class: PriorityClass
    deadline: dt.datetime
    lead_s: float | None


class MissMixin(StoreBase):
    """The store's deadline-miss reads (part of :class:`radserve.store.Store`)."""

    def deadline_misses(self, *, since: dt.datetime, now: dt.datetime) -> list[MissRecord]:
        """The misses among jobs that arrived at ``since`` or later, as of ``now``, in
        arrival order. Bounded by the window: jobs are found by their arrival index, the
        risk events by their subject index."""
        with self._read(snapshot=True) as session:
            rows = session.execute(
                select(Job.id, Job.priority_class, Job.deadline, Job.finished)
                .where(Job.arrival >= since, Job.deadline < now, Job.state != "cancelled")
                .order_by(Job.arrival, Job.id)
            ).all()
            missed = [r for r in rows if r.finished is None or r.finished > r.deadline]
            raised = _standing_raises(session, {r.id: r.deadline for r in missed})
        return [
            MissRecord(
                r.id,
                PriorityClass(r.priority_class),
                r.deadline,
                (r.deadline - raised[r.id]).total_seconds() if r.id in raised else None,
            )
            for r in missed
        ]

    def false_alerts(self, *, since: dt.datetime, now: dt.datetime) -> int:
        """Jobs that arrived at ``since`` or later and ended by their deadline (as of
        ``now``; not cancelled) though a deadline risk was raised for them."""
        raised = (
            select(AuditEntry.seq)
            .where(
                AuditEntry.subject == Job.id, AuditEntry.action == Action.JOB_DEADLINE_RISK.value
            )
            .exists()
        )
        with self._read(snapshot=True) as session:
            return int(
                session.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(
                        Job.arrival >= since,
                        Job.state != "cancelled",
                        Job.finished <= Job.deadline,
                        Job.finished <= now,
                        raised,
                    )
                )
                or 0
            )


def _standing_raises(
    session: Session, deadlines: Mapping[str, dt.datetime]
) -> dict[str, dt.datetime]:
    """Per job, the time of the risk raise standing at its deadline (the last risk event
    about it at or before the deadline, if that was a raise)."""
    last: dict[str, tuple[str, dt.datetime]] = {}
    ids = list(deadlines)
    for start in range(0, len(ids), _CHUNK):
        rows = session.execute(
            select(AuditEntry.subject, AuditEntry.action, AuditEntry.ts)
            .where(
                AuditEntry.subject.in_(ids[start : start + _CHUNK]),
                AuditEntry.action.in_(_RISK_ACTIONS),
            )
            .order_by(AuditEntry.seq)
        ).all()
        for subject, action, ts in rows:
            if subject is not None and ts <= deadlines[subject]:
                last[subject] = (action, ts)
    return {job: ts for job, (action, ts) in last.items() if action == Action.JOB_DEADLINE_RISK}


__all__ = ["MissMixin", "MissRecord"]
