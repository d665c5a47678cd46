"""A job's class is its row's: this server's queue follows the rows of the jobs it holds.

A more urgent duplicate submission (:mod:`radserve.service.duplicates`) raises a job's
class in its row, and with replicas that may be on a replica whose queue does not hold
the job (or before the job reached any queue). The server whose scheduler holds it learns
of the change here: every ``jobs.lease_poll_s`` it reads the class of each job its
scheduler holds and

- re-files a waiting job whose row names another class (its deadline: arrival + that
  class's TAT, as :meth:`radserve.scheduling.Scheduler.reprioritise`), so a study raised
  to URGENT through another replica overtakes routine work here within one look;
- sets back the row of a job that started under its old class before the look (its row
  then said it waited): the row says what the job runs as, audited as
  ``job.reprioritised`` with ``reason: started_before_refile``.

A change made through this server (:class:`radserve.service.jobs.JobRefiler`) writes the
scheduler and the row under :data:`radserve.service.jobs.REFILING`; a look reads the
queue and acts under it too, and skips a job whose class changed here in between, so it
never acts on one of the two steps without the other. Cost: the rows are read in one
query per 500 jobs (PostgreSQL: 7 ms for 100 jobs, 39 ms for 1,000, 228 ms for 5,000;
SQLite 1.5, 12 and 46 ms; 2-core machine at load ~5, 2026-12-07).
"""

from __future__ import annotations

import datetime as dt
import logging

from radserve.domain.priority import PriorityClass
from radserve.scheduling import NotWaitingError, Scheduler
from radserve.service.jobcache import JobCache
from radserve.service.jobs import REFILING, refile_record
from radserve.service.periodic_sweep import PeriodicSweep
from radserve.store import JobRecord, Store

STARTED_REASON = "started_before_refile"  # a job.reprioritised record's ``reason``


class RowClasses(PeriodicSweep):
    """Files the jobs this server's scheduler holds under their rows' classes (see the
    module), at start and every ``every_s``."""

    what = "following the job rows' classes"
    thread_name = "radserve-row-classes"
    log = logging.getLogger(__name__)

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        cache: JobCache,
        *,
        every_s: float,
        owner: str | None = None,
    ) -> None:
        super().__init__(store, grace_s=0.0, every_s=every_s)
        self.scheduler = scheduler
        self.cache = cache
        # this server's lease owner: a row another replica holds now (taken over) is
        # never set back from here
        self.owner = owner

    def sweep(self) -> int:
        """One look; returns how many jobs it re-filed or set back. The rows are read
        outside :data:`REFILING` (an operator's re-prioritisation does not wait for the
        query); a job whose class this server changed meanwhile is left to the next look."""
        with REFILING:
            _, order = self.scheduler.queue_order()
        if not order:
            return 0
        rows = self.store.row_classes([job.job_id for job in order])
        changed = 0
        with REFILING:
            for job in order:
                row = rows.get(job.job_id)
                if row is None or row[0] is job.cls or row[1].terminal:
                    continue
                now = self.scheduler.job_info(job.job_id)
                if now is None or now.cls is not job.cls:
                    continue  # finished, or re-filed here since the queue was read
                if job.running:
                    changed += self._set_back(job.job_id, job.cls, row[0])
                else:
                    changed += self._refile(job.job_id, row[0])
        return changed

    def _refile(self, job_id: str, cls: PriorityClass) -> int:
        # the row first, into the cache (this server's API and the worklist's live row):
        # once the queue says the new class, so does every read of the job here
        self.cache.put(self.store.get_job(job_id))
        try:
            done = self.scheduler.reprioritise(job_id, cls)
        except NotWaitingError:  # started since the queue was read: the next look
            return 0
        self.log.info(
            "job %s re-filed %s -> %s as its row says (changed elsewhere)",
            job_id,
            done.old_cls.name,
            done.new_cls.name,
        )
        return 1

    def _set_back(self, job_id: str, runs_as: PriorityClass, row_cls: PriorityClass) -> int:
        record = self.store.get_job(job_id)
        deadline = record.arrival + dt.timedelta(seconds=self.scheduler.config.tat(runs_as))

        def still(row: JobRecord) -> bool:
            ours = self.owner is None or row.lease_owner == self.owner
            return ours and row.priority_class is row_cls and not row.state.terminal

        back = self.store.refile_row(
            job_id,
            runs_as,
            deadline,
            when=still,
            actor_key_id=None,
            client_address=None,
            extra=refile_record(row_cls, runs_as, record.deadline, deadline, STARTED_REASON),
        )
        if back is None:
            return 0
        self.log.info(
            "job %s started as %s before its row's %s was followed: the row says %s again",
            job_id,
            runs_as.name,
            row_cls.name,
            runs_as.name,
        )
        self.cache.put(back)
        return 1


__all__ = ["STARTED_REASON", "RowClasses"]
