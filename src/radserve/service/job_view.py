"""What the API shows of a job beyond its record: its queue position, its ETA, and what
it waits for when nothing on this server can run it.

A module of its own (only the store's record type under it): the API reader processes
unpickle these views from the serving process's snapshot (:mod:`radserve.api.
job_snapshot`) and serialise them, and must not import the scheduler, the turnaround
model or the report and ingest code that :mod:`radserve.service.jobs` and
:mod:`radserve.service.turnaround` need (docs/scaling.md: a reader's memory).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from radserve.store import JobRecord


@dataclass(frozen=True)
class JobEta:
    """One job's ETA as the API shows it (UTC datetimes)."""

    predicted_start: dt.datetime
    predicted_finish: dt.datetime
    predicted_finish_late: dt.datetime  # pessimistic (p90): turnaround.band
    order_position: int  # among unfinished jobs (running ones included), 0 = first
    deadline_risk: bool
    computed_at: dt.datetime
    basis: str  # the service-time source: fitted | scaled-prior | prior


@dataclass(frozen=True)
class JobWait:
    """Why no work of an unfinished job can run on this server now (every Ray device
    worker lost, new work held): its state still says ``queued`` or ``running``, so the
    view names the block and gives no ETA (:mod:`radserve.service.work_waits`)."""

    reason: str  # a stable code: no_device_worker | lease_unproven | schema_not_current
    message: str  # what blocks the work and what ends the block
    since: dt.datetime  # UTC


@dataclass(frozen=True)
class JobView:
    """A job record plus what only the running scheduler knows."""

    record: JobRecord
    position: int | None  # among waiting jobs; None unless queued
    eta: JobEta | None = None  # queued and running jobs (radserve.service.turnaround)
    waiting_for: JobWait | None = None  # unfinished jobs nothing can run now (eta None)


__all__ = ["JobEta", "JobView", "JobWait"]
