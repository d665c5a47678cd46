"""What this server's unfinished jobs wait for when none of their work can run here.

A job's state says where it is in its life (``queued``, ``running``), not whether its
work moves: with every Ray device worker lost, or the scheduler holding all new work
(its job leases unproven, the database migrated by a newer radserve), a job kept its
state and an ETA computed as if its batches ran, so a caller saw work progressing that
was not. :class:`WorkWaits` names the block for every unfinished job of this server
(:attr:`radserve.service.job_view.JobView.waiting_for`, the API's ``waiting_for``), and
:class:`radserve.service.jobs.JobAccess` then gives no ETA. ``/readyz`` names the same
blocks (:class:`radserve.service.service.Readiness`).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING

from radserve.service.executors import workers_down
from radserve.service.job_view import JobWait

if TYPE_CHECKING:
    from radserve.scheduling import Executor, Scheduler

NO_DEVICE_WORKER = "no_device_worker"


class WorkWaits:
    """Called per status read: cheap (no database, no scheduler lock)."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.wall = wall

    def __call__(self) -> JobWait | None:
        """What blocks all work of this server now, or None while work can run."""
        now = self.wall()
        held = self.scheduler.held
        if held is not None:
            held_s = max(0.0, self.scheduler.clock.now() - held.since)
            return JobWait(held.reason, held.message, _utc(now - held_s))
        down = workers_down(self.executor)
        workers = getattr(self.executor, "workers", ())
        if down and isinstance(workers, Sized) and len(down) >= len(workers):
            latest_s = min(down.values())
            names = ", ".join(sorted(down))
            return JobWait(
                NO_DEVICE_WORKER,
                f"no Ray worker is alive: every device worker ({names}) was lost, the last "
                f"{latest_s:.0f} s ago; the work goes on once Ray restarts or replaces one "
                "(or a node with their resources joins)",
                _utc(now - latest_s),
            )
        return None


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


__all__ = ["NO_DEVICE_WORKER", "WorkWaits"]
