"""A study submitted again while its first job is still unfinished is answered by that job.

The same input (study bytes, pipeline, models, precision) over the same route, while its
job is received, queued or running, gets that job back (202, its id) instead of a second
job and a second result: as a result already made answers it from the cache. The
decision is taken in the transaction that would insert the job row, under a lock on the
input (:mod:`radserve.store.joins`), so two submissions at once -- to one server or to
two replicas sharing PostgreSQL -- make one job. It is the only place an unfinished job
answers a submission: the gateways' unchanged re-send (``reuse``) looks up succeeded
jobs only and leaves an unfinished one to this lock, and a submission whose queue is
full joins here too (:meth:`radserve.store.Store.join_unfinished`: a duplicate needs
no queue place), so a sender that re-sends because it got no answer gets the job.

Rules (:func:`join_rule`):

- Only a job the submitter may see (``Origin.sees``, ``security.visibility``): another
  site's gets a job of its own, so the answer never says another site has that study.
- Only a job of the same route: a study stored over DICOMweb gets its SEG/SR, one
  received from a PACS is sent back there; another route's job would not do that.
- A more urgent submission (e.g. URGENT after OUTPATIENT) raises the job's class
  (:func:`raise_priority`, audited as ``job.reprioritised`` with ``reason:
  duplicate_submission``), wherever it waits: in this server's queue it is re-filed at
  once; otherwise (another replica's queue, or not yet handed to a scheduler) its row is
  raised while it still waits, and the replica that holds it files it under the row's
  class at its next look (:mod:`radserve.service.row_classes`, every
  ``jobs.lease_poll_s``). A job that has started keeps its class and is joined as it is
  (it runs already); one that started on its replica before that replica looked gets
  its row set back to the class it runs under (audited). A less or equally urgent
  submission joins as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radserve.domain.jobs import JobState as RunState
from radserve.domain.priority import PriorityClass
from radserve.scheduling import NotWaitingError, Scheduler
from radserve.service.jobs import JobRefiler
from radserve.store import CacheKey, JobRecord, Store
from radserve.store.joins import JoinRule

logger = logging.getLogger(__name__)

DUPLICATE_REASON = "duplicate_submission"  # a job.reprioritised record's ``reason``


def join_rule(
    key: CacheKey,
    *,
    source: str,
    priority: PriorityClass,
    sees: Callable[[str | None], bool] | None,
    scheduler: Scheduler,
    results_seen: int | None = None,
) -> JoinRule:
    """Which unfinished job a submission of ``key`` over ``source`` at ``priority``
    joins (see the module doc). ``sees`` is asked inside the insert's locked transaction:
    call :func:`warm` first, so it answers from memory there. ``results_seen``: what
    :func:`warm` counted (a result recorded since then answers instead)."""

    def accepts(job: JobRecord) -> bool:
        if sees is not None and not sees(job.api_key_id):
            return False
        if priority.rank >= PriorityClass(job.priority_class).rank:
            return True
        # more urgent: joined unless this server's scheduler is letting the job go (its
        # end not written yet); not in this scheduler: it waits or runs elsewhere, and
        # its row is raised (raise_priority)
        info = scheduler.job_info(job.id)
        return info is None or info.state in (RunState.QUEUED, RunState.RUNNING)

    return JoinRule(
        key,
        source,
        accepts,
        audit_extra={"priority_class_asked": priority.value},
        results_seen=results_seen,
    )


def warm(store: Store, key: CacheKey, sees: Callable[[str | None], bool] | None) -> int:
    """Ask ``sees`` about the submitters of ``key``'s unfinished jobs now, outside the
    lock: it looks a key's scope up in the database once and keeps it (ReadAccess), and
    a look-up inside the lock would hold a second connection while other submissions of
    the input wait for it, each holding one. Returns how many succeeded jobs the input
    has (:attr:`JoinRule.results_seen`): call it before the result cache's look-up."""
    if sees is not None:
        for job in store.unfinished_jobs_for(key):
            sees(job.api_key_id)
    return store.results_for(key)


def raise_priority(
    job: JobRecord,
    priority: PriorityClass,
    *,
    refiler: JobRefiler,
    key_id: str | None,
    client: str | None,
) -> JobRecord:
    """``job``, filed under ``priority`` when that is more urgent than its class and it
    still waits, on whichever replica's queue holds it (:class:`JobRefiler`: its
    deadline is arrival + the class's TAT, as an operator's re-prioritisation), recorded
    as ``job.reprioritised`` naming the second submitter and ``reason:
    duplicate_submission``. A job that started meanwhile keeps its class (it is running)."""
    if priority.rank >= PriorityClass(job.priority_class).rank:
        return job
    try:
        return refiler.refile(
            job.id,
            priority,
            key_id=key_id,
            client=client,
            reason=DUPLICATE_REASON,
            only_more_urgent=True,
        )
    except NotWaitingError:  # started meanwhile, or raised already by another submission
        now = refiler.store.get_job(job.id)
        _started(now, PriorityClass(now.priority_class))
        return now


def _started(job: JobRecord, current: PriorityClass) -> None:
    logger.info(
        "job %s answers a more urgent second submission as it is (%s, class %s)",
        job.id,
        job.state.value,
        current.name,
    )


__all__ = ["DUPLICATE_REASON", "join_rule", "raise_priority", "warm"]
