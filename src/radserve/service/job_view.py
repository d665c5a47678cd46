"""What the API shows of a job beyond its record: its queue position, its ETA, what it
waits for when nothing on this server can run it, and whether the retention policy
removed its result.

A module of its own (only the store's record type under it): the API reader processes
unpickle these views from the serving process's snapshot (:mod:`radserve.api.
job_snapshot`) and serialise them, and must not import the scheduler, the turnaround
model or the report and ingest code that :mod:`radserve.service.jobs` and
:mod:`radserve.service.turnaround` need (docs/scaling.md: a reader's memory).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from radserve.service.errors import ResultRemovedError
from radserve.store import JobRecord

# The retention sweep's record on a job whose result folder it removed: a job warning
# (``queue_meta["warnings"]``), so GET /v1/jobs/{id} lists it with no new field, every
# process and replica reads it from the row, and it is the code of the 410 the job's
# result endpoints answer (radserve.api.routes.jobs).
RESULT_REMOVED = ResultRemovedError.code
RESULT_RETENTION_SETTING = "storage.result_retention_days"
RETENTION_STAGE = "retention"


def result_removed_warning(on: dt.date) -> dict[str, str]:
    """The warning recorded on a job when its result folder is removed on ``on`` (UTC)."""
    return {
        "code": RESULT_REMOVED,
        "message": f"this job's result was removed by the retention policy "
        f"({RESULT_RETENTION_SETTING}) on {on.isoformat()}",
        "stage": RETENTION_STAGE,
    }


def result_removed(record: JobRecord) -> str | None:
    """What the retention sweep recorded when it removed ``record``'s result (the
    message, naming the policy and the date), or None: a dictionary look-up on the
    record at hand, no file or database read."""
    for item in record.queue_meta.get("warnings") or []:
        if isinstance(item, dict) and item.get("code") == RESULT_REMOVED:
            return str(item.get("message") or RESULT_REMOVED)
    return None


def result_removed_error(record: JobRecord, message: str) -> ResultRemovedError:
    """The 410 for a result endpoint of ``record``, whose result went (``message``:
    :func:`result_removed`'s)."""
    return ResultRemovedError(
        f"job {record.id}: {message}; the job's record and delivery history remain, and "
        "the same study sent again runs again"
    )


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


__all__ = [
    "RESULT_REMOVED",
    "JobEta",
    "JobView",
    "JobWait",
    "result_removed",
    "result_removed_error",
    "result_removed_warning",
]
