"""What the API shows of a job beyond its record: its queue position and ETA.

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
class JobView:
    """A job record plus what only the running scheduler knows."""

    record: JobRecord
    position: int | None  # among waiting jobs; None unless queued
    eta: JobEta | None = None  # queued and running jobs (radserve.service.turnaround)


__all__ = ["JobEta", "JobView"]
