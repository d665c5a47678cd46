"""The scheduler's events -> job rows, the result cache, audit records, metrics.

The scheduler calls these hooks outside its lock, in event order, on its worker
threads. Every store write commits before the in-memory job cache is updated. A result
is recorded exactly once (:meth:`Store.record_result` refuses a second one); a write the
database refuses for a moment is retried a few times, and a job whose final state could
not be written stays ``running`` in the store, so restart recovery runs it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from radserve.scheduling import BatchEvent, DeadlineMiss, JobEvent, JobState
from radserve.service.jobcache import JobCache
from radserve.service.mapping import to_settings_class
from radserve.service.metrics import Metrics
from radserve.store import (
    CacheKey,
    InvalidTransitionError,
    JobRecord,
    ResultAlreadyRecordedError,
    Store,
    StoreError,
)
from radserve.store import JobState as StoredState
from radserve.study import StudyResult

logger = logging.getLogger(__name__)

T = TypeVar("T")
_STORE_RETRIES = (0.1, 0.5, 2.0)
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
    ) -> None:
        self.store = store
        self.cache = cache
        self.metrics = metrics
        self.on_result = on_result
        # job id -> (key id, client address) of whoever asked to cancel it (for the audit)
        self._cancellers: dict[str, tuple[str | None, str | None]] = {}
        self._lock = threading.Lock()

    def note_cancel(self, job_id: str, key_id: str | None, client: str | None) -> None:
        with self._lock:
            self._cancellers[job_id] = (key_id, client)

    # --- JobHooks ---------------------------------------------------------------------
    def on_state(self, event: JobEvent) -> None:
        cls = to_settings_class(event.cls).value
        self.metrics.jobs.labels(event.state.value, cls).inc()
        if event.state is JobState.QUEUED:
            self._queued(event)
        elif event.state is JobState.RUNNING:
            self._put(self._write(lambda: self.store.transition(event.job_id, StoredState.RUNNING)))
        elif event.state is JobState.SUCCEEDED:
            self._succeeded(event)
            self.metrics.tat.labels(cls).observe(event.timings.get("total", 0.0))
            self.metrics.observe_stages(dict(event.timings))
        elif event.state is JobState.FAILED:
            self.metrics.errors.labels(event.error_code or "internal_error").inc()
            self._put(
                self._write(
                    lambda: self.store.transition(
                        event.job_id,
                        StoredState.FAILED,
                        error_code=event.error_code or "internal_error",
                        error_message=event.error_message or "the job failed",
                        stage_timings=dict(event.timings),
                    )
                )
            )
        elif event.state is JobState.CANCELLED:
            with self._lock:
                key_id, client = self._cancellers.pop(event.job_id, (None, None))
            self._put(
                self._write(
                    lambda: self.store.transition(
                        event.job_id,
                        StoredState.CANCELLED,
                        actor_key_id=key_id,
                        client_address=client,
                        error_code=event.error_code or "job_cancelled",
                        error_message=event.error_message or "cancelled by request",
                        stage_timings=dict(event.timings),
                    )
                )
            )

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        self.metrics.deadline_misses.labels(to_settings_class(miss.cls).value).inc()

    def on_batch(self, event: BatchEvent) -> None:
        self.metrics.batch_size.labels(event.model.name).observe(event.items)
        self.metrics.batch_seconds.labels(event.model.name, event.device).observe(event.seconds)
        if not event.ok:
            self.metrics.errors.labels("batch_failed").inc()

    # --- states -----------------------------------------------------------------------
    def _queued(self, event: JobEvent) -> None:
        record = self.cache.get(event.job_id)
        if record is None or record.state is StoredState.RECEIVED:
            try:
                record = self._write(
                    lambda: self.store.transition(event.job_id, StoredState.QUEUED)
                )
            except InvalidTransitionError:  # resumed after a restart: queued already
                record = self.store.get_job(event.job_id)
        self._put(record)

    def _succeeded(self, event: JobEvent) -> None:
        result = event.result
        if not isinstance(result, StudyResult):
            raise TypeError(f"job {event.job_id}: expected a StudyResult, got {type(result)}")
        job = self.cache.get(event.job_id) or self.store.get_job(event.job_id)
        if self.on_result is not None:
            try:  # before the result is recorded: a crash in between loses no delivery
                self.on_result(job, result)
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
        outputs = {"findings": len(report.findings), "organs": len(report.organ_measurements)}
        try:
            record = self._write(
                lambda: self.store.record_result(
                    event.job_id,
                    str(result.out_dir),
                    key,
                    stage_timings=dict(event.timings),
                    outputs=outputs,
                )
            )
        except ResultAlreadyRecordedError:
            logger.warning("job %s: a result was recorded already; this copy is discarded", job.id)
            record = self.store.get_job(event.job_id)
        except InvalidTransitionError as exc:  # cancelled while its report was written
            logger.info("job %s: result not recorded (%s)", job.id, exc.code)
            record = self.store.get_job(event.job_id)
        self._put(record)

    # --- helpers ----------------------------------------------------------------------
    def _put(self, record: JobRecord | None) -> None:
        if record is not None:
            self.cache.put(record)

    @staticmethod
    def _write(call: Callable[[], T]) -> T:
        """``call()``, retried while the database is briefly unavailable."""
        for delay in (*_STORE_RETRIES, None):
            try:
                return call()
            except StoreError as exc:
                if not exc.retryable or delay is None:
                    raise
                logger.warning("store unavailable (%s); retrying in %.1f s", exc.code, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")


__all__ = ["ResultCallback", "ServiceHooks"]
