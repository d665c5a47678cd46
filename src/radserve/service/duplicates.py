"""A study submitted again while its first job is still unfinished is answered by that job.

The same input (study bytes, pipeline, models, precision) over the same route, while its
job is received, queued or running, gets that job back (202, its id) instead of a second
job and a second result: as a result already made answers it from the cache. The
decision is taken in the transaction that would insert the job row, under a lock on the
input (:mod:`radserve.store.joins`), so two submissions at once -- to one server or to
two replicas sharing PostgreSQL -- make one job.

Rules (:func:`join_rule`):

- Only a job the submitter may see (``Origin.sees``, ``security.visibility``): another
  site's gets a job of its own, so the answer never says another site has that study.
- Only a job of the same route: a study stored over DICOMweb gets its SEG/SR, one
  received from a PACS is sent back there; another route's job would not do that.
- A more urgent submission (e.g. URGENT after OUTPATIENT) joins a job only if this
  server can raise it (:func:`raise_priority`: waiting in its queue, re-filed under the
  more urgent class and audited as ``job.reprioritised``) or it is running here already.
  A job waiting on another replica (whose queue this server cannot re-file) or not yet
  handed to the scheduler is not joined: the urgent study gets its own job rather than
  wait behind routine work. A less or equally urgent submission joins as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radserve.domain.jobs import JobState as RunState
from radserve.domain.priority import PriorityClass
from radserve.scheduling import NotWaitingError, Scheduler
from radserve.service.jobcache import JobCache
from radserve.service.jobs import refile
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
) -> JoinRule:
    """Which unfinished job a submission of ``key`` over ``source`` at ``priority``
    joins (see the module doc). ``sees`` is asked inside the insert's locked transaction:
    call :func:`warm` first, so it answers from memory there."""

    def accepts(job: JobRecord) -> bool:
        if sees is not None and not sees(job.api_key_id):
            return False
        if priority.rank >= PriorityClass(job.priority_class).rank:
            return True
        info = scheduler.job_info(job.id)
        return info is not None and info.state in (RunState.QUEUED, RunState.RUNNING)

    return JoinRule(key, source, accepts, audit_extra={"priority_class_asked": priority.value})


def warm(store: Store, key: CacheKey, sees: Callable[[str | None], bool] | None) -> None:
    """Ask ``sees`` about the submitters of ``key``'s unfinished jobs now, outside the
    lock: it looks a key's scope up in the database once and keeps it (ReadAccess), and
    a look-up inside the lock would hold a second connection while other submissions of
    the input wait for it, each holding one."""
    if sees is None:
        return
    for job in store.unfinished_jobs_for(key):
        sees(job.api_key_id)


def raise_priority(
    job: JobRecord,
    priority: PriorityClass,
    *,
    scheduler: Scheduler,
    store: Store,
    cache: JobCache,
    key_id: str | None,
    client: str | None,
) -> JobRecord:
    """``job``, re-filed under ``priority`` when that is more urgent than its class and it
    still waits in this server's queue (its deadline: arrival + the class's TAT, as an
    operator's re-prioritisation), recorded as ``job.reprioritised`` naming the second
    submitter and ``reason: duplicate_submission``. A job that started meanwhile keeps
    its class (it is running)."""
    current = PriorityClass(job.priority_class)
    if priority.rank >= current.rank:
        return job
    try:
        return refile(
            job,
            priority,
            scheduler=scheduler,
            store=store,
            cache=cache,
            key_id=key_id,
            client=client,
            reason=DUPLICATE_REASON,
        )
    except NotWaitingError:
        logger.info(
            "job %s answers a more urgent second submission; it started already, its "
            "class stays %s",
            job.id,
            current.name,
        )
        return job


__all__ = ["DUPLICATE_REASON", "join_rule", "raise_priority", "warm"]
