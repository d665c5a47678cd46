"""Fills the accession number on the rows of jobs created before revision 0020, which
the worklist's search reads from the row (:func:`radserve.store.jobs.list_jobs`).

Started with the first worklist request after start-up (as the operations history is),
it reads each such job's study header (:class:`radserve.console.studyinfo.StudyInfo`,
which also keeps it for the page) newest first, ``BATCH`` jobs a transaction, until no
row is left without one, then stops. Until then a search may miss an old job whose
number is not read yet. Replicas doing the same at once write the same values.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.concurrency import run_in_threadpool

from radserve.console.studyinfo import StudyInfo
from radserve.store import Store
from radserve.store import jobs as job_rows

BATCH = 200

logger = logging.getLogger(__name__)


class AccessionBackfill:
    """Reads the accession numbers the job rows lack, in the background, once."""

    def __init__(self, store: Store, info: StudyInfo) -> None:
        self.store = store
        self.info = info
        self.finished = False
        self._task: asyncio.Task[None] | None = None

    def ensure_running(self) -> None:
        """Start the fill on the running loop, unless it runs or has finished (one that
        failed, the database away, starts again with the next request)."""
        if self.finished or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while await run_in_threadpool(self.fill_batch):
                pass
        except Exception as exc:  # the database away: the next worklist request retries
            code = getattr(exc, "code", type(exc).__name__)
            logger.warning(
                "reading old jobs' accession numbers stopped (%s); the next worklist "
                "request starts it again",
                code,
            )
            return
        self.finished = True

    def fill_batch(self) -> int:
        """Fill up to ``BATCH`` rows; how many there were (0: none is left)."""
        unread = job_rows.unread_accessions(self.store, limit=BATCH)
        numbers = {job_id: self.info.get(job_id, path).accession for job_id, path in unread}
        job_rows.fill_accessions(self.store, numbers)
        return len(unread)


__all__ = ["BATCH", "AccessionBackfill"]
