"""Reading jobs and their results, and cancelling them.

Status reads come from the in-memory job cache (the store on a miss), queue positions
from the scheduler; result files are read from the job's result folder, and report JSON
is kept in a small memory cache because results never change once recorded.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radserve.domain.priority import PriorityClass
from radserve.service.errors import OutputNotFoundError, ResultNotReadyError
from radserve.service.job_view import JobEta, JobView, JobWait
from radserve.service.jobcache import JobCache
from radserve.store import InvalidTransitionError, JobPage, JobRecord, JobState, Store

if TYPE_CHECKING:
    from radserve.ingest import IngestPolicy
    from radserve.report.fhir.patient import IdentifierSystems
    from radserve.report.schema import Report
    from radserve.scheduling import Scheduler
    from radserve.service.hooks import ServiceHooks

logger = logging.getLogger(__name__)

REPORT_FILE = "report.json"
_REPORT_CACHE = 256
# a job's class changes in two steps, the scheduler's and its row's (JobRefiler); a
# server following its rows (radserve.service.row_classes) must see both or neither
REFILING = threading.Lock()


class JobAccess:
    def __init__(
        self,
        store: Store,
        cache: JobCache,
        scheduler: Scheduler,
        hooks: ServiceHooks,
        identifier_systems: IdentifierSystems | None = None,
        policy: IngestPolicy | None = None,
    ) -> None:
        # None: the defaults (IdentifierSystems(), IngestPolicy()), built where they are
        # used: a reader process (radserve.api.reader) never imports report or ingest code
        self.identifier_systems = identifier_systems
        # the configured ingest bounds, also when re-reading a stored study's headers
        self.policy = policy
        self.store = store
        self.cache = cache
        self.scheduler = scheduler
        self.hooks = hooks
        self._reports: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.refiler = JobRefiler(scheduler, store, cache)
        # job id -> its ETA (set by the service to its turnaround view)
        self.eta_of: Callable[[str], JobEta | None] = lambda job_id: None
        # what blocks all work of this server now (radserve.service.work_waits), or None
        self.waits_for: Callable[[], JobWait | None] = lambda: None

    # --- status -----------------------------------------------------------------------
    def cached(self, job_id: str) -> JobRecord | None:
        """The job from memory only (no database round trip); None on a miss, and for an
        unfinished job this server's scheduler does not run: another replica may have
        taken it over and finished it (its lease ran out here in a database outage),
        so only the store knows."""
        record = self.cache.get(job_id)
        if record is not None and (record.terminal or self.scheduler.runs(job_id)):
            return record
        return None

    def get(self, job_id: str) -> JobRecord:
        """The job (memory, else the store). Raises :class:`JobNotFoundError`."""
        record = self.cached(job_id)
        if record is None:
            record = self.store.get_job(job_id)
            self.cache.put(record)
        return record

    def view(self, record: JobRecord) -> JobView:
        position = None
        if record.state in (JobState.RECEIVED, JobState.QUEUED):
            info = self.scheduler.job_info(record.id)
            position = info.position if info is not None else None
        waiting = None if record.terminal else self.waits_for()
        eta = None if waiting is not None else self._eta(record)
        return JobView(record, position, eta, waiting)

    def eta(self, record: JobRecord) -> JobEta | None:
        """The ETA of a queued or running job (None for others, and while nothing can run
        its work: :attr:`waits_for`; an ETA then would show progress that is not made)."""
        if record.terminal or self.waits_for() is not None:
            return None
        return self._eta(record)

    def _eta(self, record: JobRecord) -> JobEta | None:
        if record.state not in (JobState.QUEUED, JobState.RUNNING):
            return None
        return self.eta_of(record.id)

    def list(self, **filters: Any) -> JobPage:
        return self.store.list_jobs(**filters)

    # --- cancel -----------------------------------------------------------------------
    def cancel(self, job_id: str, *, key_id: str | None, client: str | None) -> JobRecord:
        """Cancel a waiting or running job; a running one stops at its next batch.

        Raises :class:`InvalidTransitionError` for a finished job."""
        record = self.get(job_id)
        if record.terminal:
            raise InvalidTransitionError(
                f"job {job_id} is {record.state.value}: only waiting or running jobs can "
                "be cancelled"
            )
        self.hooks.note_cancel(job_id, key_id, client)
        if self.scheduler.cancel(job_id) or self.scheduler.job_info(job_id) is not None:
            # cancelled, or already on its way out: what this server last wrote of it
            # (its cancel is being written; the store need not answer now)
            return self.cache.get(job_id) or record
        # not in the scheduler (between its row and its scheduling): cancel the row
        record = self.store.transition(
            job_id,
            JobState.CANCELLED,
            actor_key_id=key_id,
            client_address=client,
            error_code="job_cancelled",
            error_message="cancelled by request",
        )
        self.cache.put(record)
        return record

    # --- re-prioritise -----------------------------------------------------------------
    def reprioritise(
        self, job_id: str, cls: PriorityClass, *, key_id: str | None, client: str | None
    ) -> JobRecord:
        """File a waiting job under ``cls`` on whichever replica's queue holds it
        (:class:`JobRefiler`), audited ``job.reprioritised`` naming who.

        Raises :class:`NotWaitingError` (409) unless the job still waits."""
        return self.refiler.refile(job_id, cls, key_id=key_id, client=client)

    # --- results ----------------------------------------------------------------------
    def result_dir(self, record: JobRecord) -> Path:
        return Path(self._result_path(record))

    def _result_path(self, record: JobRecord) -> str:
        """The result folder as stored (the report cache's key: no Path built per read)."""
        if record.state is not JobState.SUCCEEDED or not record.result_path:
            state = record.state.value
            hint = f" ({record.error_code})" if record.error_code else ""
            if record.terminal:
                raise ResultNotReadyError(f"job {record.id} is {state}{hint}; it has no result")
            raise ResultNotReadyError(
                f"job {record.id} is {state}; it has no result yet: poll GET "
                f"/v1/jobs/{record.id} until its state is succeeded",
                retryable=True,
            )
        return record.result_path

    def report_cached(self, record: JobRecord) -> bytes | None:
        """The report JSON if it is in memory (no file read), else None."""
        key = self._result_path(record)
        with self._lock:
            data = self._reports.get(key)
            if data is not None:
                self._reports.move_to_end(key)
            return data

    def report_bytes(self, record: JobRecord) -> bytes:
        key = self._result_path(record)
        folder = Path(key)
        with self._lock:
            data = self._reports.get(key)
            if data is not None:
                self._reports.move_to_end(key)
                return data
        try:
            data = (folder / REPORT_FILE).read_bytes()
        except FileNotFoundError as exc:
            raise OutputNotFoundError(f"job {record.id}: its report file is missing") from exc
        with self._lock:
            self._reports[key] = data
            while len(self._reports) > _REPORT_CACHE:
                self._reports.popitem(last=False)
        return data

    def report(self, record: JobRecord) -> Report:
        from radserve.report.json_report import parse_report

        return parse_report(self.report_bytes(record).decode())

    def label_map(self, record: JobRecord, kind: str | None) -> Path:
        report = self.report(record)
        maps = report.outputs.label_maps
        chosen = next((m for m in maps if kind is None or m.kind == kind), None)
        if chosen is None:
            have = ", ".join(m.kind for m in maps) or "none"
            raise OutputNotFoundError(
                f"job {record.id} has no {kind or ''} label map (it has: {have})"
            )
        return self._inside(record, chosen.path)

    def key_image(self, record: JobRecord, number: int) -> Path:
        images = self.report(record).outputs.key_images
        if not 1 <= number <= len(images):
            raise OutputNotFoundError(
                f"job {record.id} has {len(images)} key image(s); ask for 1..{len(images)}"
            )
        return self._inside(record, images[number - 1].path)

    def _inside(self, record: JobRecord, relative: str) -> Path:
        folder = self.result_dir(record).resolve()
        path = (folder / relative).resolve()
        if folder not in path.parents or not path.is_file():
            raise OutputNotFoundError(f"job {record.id}: output {relative} is missing")
        return path

    def fhir_bundle(self, record: JobRecord) -> dict[str, Any]:
        """The FHIR R4 Bundle of the job's report (:mod:`radserve.service.job_fhir`)."""
        from radserve.service.job_fhir import fhir_bundle_for

        return fhir_bundle_for(
            self.report(record),
            Path(record.study_path),
            self.result_dir(record),
            self.identifier_systems,
            policy=self.policy,
        )


def refile_record(
    old: PriorityClass,
    new: PriorityClass,
    old_deadline: dt.datetime,
    new_deadline: dt.datetime,
    reason: str | None = None,
) -> dict[str, str]:
    """A ``job.reprioritised`` audit record's payload: the old and new class and
    deadline, and why when it was not an operator's request."""
    return {
        "old_priority_class": old.value,
        "new_priority_class": new.value,
        "old_deadline": old_deadline.isoformat(),
        "new_deadline": new_deadline.isoformat(),
    } | ({"reason": reason} if reason is not None else {})


# a job row that still waits for a queue's slot: its class may change (re-filed)
WAITING_ROWS = (JobState.RECEIVED, JobState.QUEUED)


@dataclass(frozen=True)
class _Asked:
    """Who asked for a re-filing (audited as its actor) and why, when not an operator."""

    key_id: str | None
    client: str | None
    reason: str | None


@dataclass(frozen=True)
class JobRefiler:
    """Files a waiting job under another class wherever it waits: in this server's queue
    (the scheduler and its row, :meth:`_here`), or in its row only when another replica's
    queue holds it or none does yet (:meth:`_row`; that queue follows the row,
    :mod:`radserve.service.row_classes`). The one way an operator's re-prioritisation
    and a more urgent duplicate submission change a job's class: either may reach any
    replica behind a load balancer (before, each chose between the two on its own)."""

    scheduler: Scheduler
    store: Store
    cache: JobCache

    def refile(
        self,
        job_id: str,
        cls: PriorityClass,
        *,
        key_id: str | None,
        client: str | None,
        reason: str | None = None,
        only_more_urgent: bool = False,
    ) -> JobRecord:
        """The job ``job_id`` filed under ``cls`` (its deadline: arrival + the class's
        TAT), recorded in its row with a ``job.reprioritised`` audit record (who, the old
        and new class and deadline, ``reason`` when given) and put in the cache (the
        console's live worklist). ``only_more_urgent``: a job as urgent already is left
        as it is. Raises :class:`NotWaitingError` (409) when the job no longer waits
        (started, finished, or re-filed meanwhile)."""
        from radserve.scheduling import NotWaitingError

        # one change at a time, the scheduler's and the row's together: two requests at
        # once left the row with one class and the scheduler with the other, and audited
        # old values read before the other's change; the row poller waits too
        with REFILING:
            record = self.store.get_job(job_id)
            if record.state not in WAITING_ROWS and record.state is not JobState.RUNNING:
                raise NotWaitingError(
                    f"job {job_id} is {record.state.value}; only waiting jobs can be re-prioritised"
                )
            if only_more_urgent and cls.rank >= record.priority_class.rank:
                return record
            asked = _Asked(key_id, client, reason)
            if self.scheduler.job_info(job_id) is not None:
                refiled = self._here(record, cls, asked)
            elif record.state in WAITING_ROWS:
                refiled = self._row(record, cls, asked)
            else:
                raise NotWaitingError(f"job {job_id} is running; its class cannot change")
        self.cache.put(refiled)
        return refiled

    def _here(self, record: JobRecord, cls: PriorityClass, asked: _Asked) -> JobRecord:
        done = self.scheduler.reprioritise(record.id, cls)  # NotWaitingError: started
        deadline = self._deadline(record, cls)
        extra = refile_record(done.old_cls, done.new_cls, record.deadline, deadline, asked.reason)
        return self.store.reprioritise_job(
            record.id,
            cls,
            deadline,
            actor_key_id=asked.key_id,
            client_address=asked.client,
            extra=extra,
        )

    def _row(self, record: JobRecord, cls: PriorityClass, asked: _Asked) -> JobRecord:
        from radserve.scheduling import NotWaitingError

        deadline = self._deadline(record, cls)
        old = record.priority_class
        refiled = self.store.refile_row(
            record.id,
            cls,
            deadline,
            when=lambda row: row.state in WAITING_ROWS and row.priority_class is old,
            actor_key_id=asked.key_id,
            client_address=asked.client,
            extra=refile_record(old, cls, record.deadline, deadline, asked.reason),
        )
        if refiled is None:
            raise NotWaitingError(f"job {record.id} started or was re-filed meanwhile; ask again")
        logger.info(
            "job %s re-filed %s -> %s in its row; the server whose queue holds it files it "
            "so at its next look",
            record.id,
            old.name,
            cls.name,
        )
        return refiled

    def _deadline(self, record: JobRecord, cls: PriorityClass) -> dt.datetime:
        return record.arrival + dt.timedelta(seconds=self.scheduler.config.tat(cls))


__all__ = [
    "REFILING",
    "WAITING_ROWS",
    "JobAccess",
    "JobRefiler",
    "JobView",
    "refile_record",
]
