"""The scheduler's events -> job rows, the result cache, audit records, metrics.

The scheduler calls these hooks outside its lock, in event order, on its worker
threads. Every store write commits before the in-memory job cache is updated. A result
is recorded exactly once (:meth:`Store.record_result` refuses a second one); a write the
database refuses for a moment is retried out a restart, and an event whose write an
outage outlasts is held and written in order when the database answers
(:mod:`radserve.service.deferred`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from radserve.audit.digests import model_digests, output_digests
from radserve.pipeline.study import StudyResult
from radserve.scheduling import BatchEvent, DeadlineMiss, JobEvent, JobHooks, JobState
from radserve.service.deferred import DeferredWrites
from radserve.service.jobcache import JobCache
from radserve.service.metrics import Metrics
from radserve.store import (
    CacheKey,
    DatabaseUnavailableError,
    InvalidTransitionError,
    JobRecord,
    LeaseLostError,
    ResultAlreadyRecordedError,
    Store,
)
from radserve.store.waiting import WaitLog

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Every write of a job's progress (queued, running, its deliveries, its result, failed)
# waits out a database restart (``jobs.store_outage_wait_s``, ~2 min); the retries run on
# the scheduler's event thread, in order, so later events of a job never overtake an
# earlier one. Past the wait the event is held (radserve.service.deferred).
OUTAGE_RETRIES = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 30.0, 30.0)


def outage_delays(wait_s: float) -> tuple[float, ...]:
    """The retry delays of :data:`OUTAGE_RETRIES` (then 30 s each) that fit in ``wait_s``,
    the last one shortened to end there."""
    delays: list[float] = []
    left = wait_s
    for delay in (*OUTAGE_RETRIES, *(30.0,) * int(wait_s // 30.0)):
        if left <= 0:
            break
        delays.append(min(delay, left))
        left -= delay
    return tuple(delays)


def retry_store(
    call: Callable[[], T], delays: tuple[float, ...] = OUTAGE_RETRIES, *, what: str
) -> T:
    """``call()``, retried after each of ``delays`` while the database is unavailable
    (:class:`DatabaseUnavailableError`); the last error is raised. Logged when it starts
    waiting and when it ends (``what``: the write, e.g. "job <id>: running")."""
    log = WaitLog(what, sum(delays))
    for delay in (*delays, None):
        try:
            result = call()
        except DatabaseUnavailableError as exc:
            if delay is None:
                if log.failures:  # no retries (events held): the caller holds it and says so
                    log.gave_up(exc)
                raise
            log.failed(exc)
            time.sleep(delay)
        else:
            log.answered()
            return result
    raise AssertionError("unreachable")


ResultCallback = Callable[[JobRecord, StudyResult], None]


class ServiceHooks:
    """Implements :class:`radserve.scheduling.JobHooks` for the service."""

    def __init__(
        self,
        store: Store,
        cache: JobCache,
        metrics: Metrics,
        *,
        on_result: ResultCallback | None = None,
        outage_wait_s: float = sum(OUTAGE_RETRIES),
    ) -> None:
        self.store = store
        self.outage_delays = outage_delays(outage_wait_s)
        self.cache = cache
        self.metrics = metrics
        self.on_result = on_result
        # a job failed (after its study was accepted): tell the sender's side
        self.on_failed: Callable[[JobRecord], None] | None = None
        # a job succeeded or failed, its final row written (model lifecycle records)
        self.on_finished: Callable[[JobRecord], None] | None = None
        # a result was recorded, so the deliveries held for it are due: wake the senders
        # (they slept on their idle interval, since a held row is not due)
        self.on_recorded: Callable[[], None] | None = None
        # job id -> (key id, client address) of whoever asked to cancel it (for the audit)
        self._cancellers: dict[str, tuple[str | None, str | None]] = {}
        self._lock = threading.Lock()
        # told of every state change and miss after the above (e.g. service.turnaround)
        self.followers: list[JobHooks] = []
        # this replica's job lease owner (radserve.store.leases): every write of a run is
        # fenced by it, so a run whose job another replica took over writes nothing
        self.owner: str | None = None
        # events whose write an outage outlasted, written in order when it ends
        self.deferred = DeferredWrites(self._apply_held)

    def note_cancel(self, job_id: str, key_id: str | None, client: str | None) -> None:
        with self._lock:
            self._cancellers[job_id] = (key_id, client)

    # --- JobHooks ---------------------------------------------------------------------
    def on_state(self, event: JobEvent) -> None:
        try:
            self._count(event)
            if not self.deferred.hold_if_behind(event):  # a held event of its job goes first
                self._on_state(event)
        except LeaseLostError:
            logger.warning(
                "job %s: taken over by another replica (lease expired); this run's %s is "
                "not recorded",
                event.job_id,
                event.state.value,
            )
        except DatabaseUnavailableError as exc:  # written once the database answers
            self.deferred.hold(event, exc)
        finally:
            for follower in self.followers:
                follower.on_state(event)

    def _count(self, event: JobEvent) -> None:
        """The event's metrics: counted when it happens, once, whenever it is written."""
        cls = event.cls.value
        if event.error_code == LeaseLostError.code:  # another replica runs it: not an outcome
            self.metrics.errors.labels(LeaseLostError.code).inc()
            return
        self.metrics.jobs.labels(event.state.value, cls).inc()
        if event.state is JobState.SUCCEEDED:
            self.metrics.tat.labels(cls).observe(event.timings.get("total", 0.0))
            self.metrics.observe_stages(dict(event.timings))
            self.metrics.paused.labels(cls).inc(event.timings.get("paused", 0.0))
        elif event.state is JobState.FAILED:
            self.metrics.errors.labels(event.error_code or "internal_error").inc()

    def _apply_held(self, event: JobEvent) -> None:
        try:
            self._on_state(event)
        except LeaseLostError:  # another replica runs it now: nothing of this run counts
            logger.warning("job %s: taken over while its %s was held", event.job_id, event.state)

    def _on_state(self, event: JobEvent) -> None:
        if event.state is JobState.QUEUED:
            self._queued(event)
        elif event.state is JobState.RUNNING:
            self._put(
                self._write(
                    event,
                    lambda: self.store.transition(event.job_id, JobState.RUNNING, owner=self.owner),
                )
            )
        elif event.state is JobState.SUCCEEDED:
            self._succeeded(event)
        elif event.state is JobState.FAILED:
            failed = self._write(
                event,
                lambda: self.store.transition(
                    event.job_id,
                    JobState.FAILED,
                    error_code=event.error_code or "internal_error",
                    error_message=event.error_message or "the job failed",
                    stage_timings=dict(event.timings),
                    owner=self.owner,
                ),
            )
            self._put(failed)
            if self.on_failed is not None:
                self.on_failed(failed)  # the failure notice (its own errors are logged)
        elif event.state is JobState.CANCELLED:
            with self._lock:
                key_id, client = self._cancellers.pop(event.job_id, (None, None))
            self._put(
                self._write(
                    event,
                    lambda: self.store.transition(
                        event.job_id,
                        JobState.CANCELLED,
                        actor_key_id=key_id,
                        client_address=client,
                        error_code=event.error_code or "job_cancelled",
                        error_message=event.error_message or "cancelled by request",
                        stage_timings=dict(event.timings),
                    ),
                )
            )

        if self.on_finished is not None and event.state in (JobState.SUCCEEDED, JobState.FAILED):
            record = self.cache.get(event.job_id)
            if record is not None and record.terminal:
                try:
                    self.on_finished(record)
                except Exception:  # bookkeeping only: the job's outcome stands
                    logger.exception("job %s: the finished-job listener failed", event.job_id)

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        self.metrics.deadline_misses.labels(miss.cls.value).inc()
        for follower in self.followers:
            follower.on_deadline_miss(miss)

    def on_batch(self, event: BatchEvent) -> None:
        self.metrics.batch_size.labels(event.model.name).observe(event.items)
        self.metrics.batch_seconds.labels(event.model.name, event.device).observe(event.seconds)
        if not event.ok:
            self.metrics.errors.labels("batch_failed").inc()

    # --- states -----------------------------------------------------------------------
    def _queued(self, event: JobEvent) -> None:
        record = self.cache.get(event.job_id)
        if record is None or record.state is JobState.RECEIVED:
            try:
                record = self._write(
                    event,
                    lambda: self.store.transition(event.job_id, JobState.QUEUED, owner=self.owner),
                )
            except LeaseLostError:
                raise
            except InvalidTransitionError:  # resumed after a restart: queued already
                record = self.store.get_job(event.job_id)
        self._put(record)

    def _succeeded(self, event: JobEvent) -> None:
        result = event.result
        if not isinstance(result, StudyResult):
            raise TypeError(f"job {event.job_id}: expected a StudyResult, got {type(result)}")
        job = self.cache.get(event.job_id) or self.store.get_job(event.job_id)
        # its deliveries are held for this run's owner until its result is recorded
        job = dataclasses.replace(job, lease_owner=self.owner)
        if self.on_result is not None:
            try:  # before the result is recorded: a crash in between loses no delivery
                self.on_result(job, result)
            except DatabaseUnavailableError:
                # The database stayed unavailable through the retries: recording the
                # result now would leave it without its deliveries, for good. The whole
                # event is held (DeferredWrites) and written, deliveries first, when the
                # database answers; if this process stops first, the job runs again.
                raise
            except LeaseLostError:  # taken over: its deliveries were refused, as is its result
                raise
            except Exception as exc:  # the result stands; only its delivery failed
                code = getattr(exc, "code", type(exc).__name__)
                logger.error("job %s: queueing its results for delivery failed (%s)", job.id, code)
                self.metrics.errors.labels("delivery_enqueue_failed").inc()
        key = CacheKey(
            fingerprint=job.fingerprint,
            pipeline_name=job.pipeline_name,
            pipeline_version=job.pipeline_version,
            model_versions=dict(job.model_versions),
            precision=job.precision,
        )
        report = result.report
        outputs = {
            "findings": len(report.findings),
            "organs": len(report.organ_measurements),
            # what was produced, with which weights (radserve.audit.digests)
            "sha256": output_digests(result.out_dir),
            "model_sha256": model_digests(report),
        }
        try:
            record = self._write(
                event,
                lambda: self.store.record_result(
                    event.job_id,
                    str(result.out_dir),
                    key,
                    stage_timings=dict(event.timings),
                    outputs=outputs,
                    owner=self.owner,
                ),
            )
        except LeaseLostError:
            raise
        except ResultAlreadyRecordedError:
            logger.warning("job %s: a result was recorded already; this copy is discarded", job.id)
            record = self.store.get_job(event.job_id)
        except InvalidTransitionError as exc:  # cancelled while its report was written
            logger.info("job %s: result not recorded (%s)", job.id, exc.code)
            record = self.store.get_job(event.job_id)
        else:
            if self.on_recorded is not None:
                self.on_recorded()
        self._put(record)

    # --- helpers ----------------------------------------------------------------------
    def _put(self, record: JobRecord | None) -> None:
        if record is not None:
            self.cache.put(record)

    def write_delays(self) -> tuple[float, ...]:
        """How long a job's write waits for the database: out a restart, unless it is
        already known to be down (events held), when the write joins the held ones."""
        return () if self.deferred.active else self.outage_delays

    def _write(self, event: JobEvent, call: Callable[[], T]) -> T:
        """``call()``, the write of ``event``, retried while the database is unavailable."""
        return retry_store(
            call, self.write_delays(), what=f"job {event.job_id}: {event.state.value}"
        )


__all__ = ["OUTAGE_RETRIES", "ResultCallback", "ServiceHooks", "outage_delays", "retry_store"]
