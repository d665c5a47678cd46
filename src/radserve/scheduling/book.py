"""The table of unfinished jobs and their life cycle, under the scheduler's lock.

queued -> running (first unit dispatched) -> succeeded | failed | cancelled. A job that
must end is marked ``stopping`` at once and becomes terminal when nothing of it is in
flight (its next batch boundary). Every transition queues a hook call; the scheduler
makes the calls after releasing its lock.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import Counter, deque
from collections.abc import Callable

from radserve.config import JobSettings, SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.errors import RadserveError
from radserve.scheduling.breaker import CircuitBreakers
from radserve.scheduling.dispatch import CpuDispatch, MergeDispatch, PrepareDispatch, StageDispatch
from radserve.scheduling.errors import JobTimeoutError, ModelUnavailableError
from radserve.scheduling.jobs import (
    DeadlineMiss,
    JobEvent,
    JobHooks,
    JobInfo,
    JobState,
    QueuedJob,
    SchedulerSnapshot,
)
from radserve.scheduling.rank_index import RankIndex
from radserve.scheduling.selection import eligible, may_prepare, may_start
from radserve.scheduling.state import ScheduledJob, StepProgress
from radserve.scheduling.work import CpuStage
from radserve.security.logs import redact

logger = logging.getLogger(__name__)

_SERVICE_EWMA = 0.2


class JobBook:
    def __init__(self, config: SchedulerSettings, jobs: JobSettings, hooks: JobHooks) -> None:
        self.config = config
        self.limits = jobs
        self.hooks = hooks
        self.breakers = CircuitBreakers(config.breaker_threshold)
        self.jobs: dict[str, ScheduledJob] = {}
        # the active jobs in rank order: those waiting (start order) and those started
        self.queue = RankIndex(config)
        self.started = RankIndex(config)
        self.events: deque[Callable[[], None]] = deque()
        self.misses: Counter[PriorityClass] = Counter()
        # waiting routine jobs holding the next free routine slot (deadline-risk policy
        # ``reserve``: Scheduler.reserve); a job leaves when it starts or stops
        self.reserved: dict[str, ScheduledJob] = {}
        self.prepared = 0  # batches prepared (or being prepared), not yet on a device
        self.service_s: float | None = None  # EWMA of the run time of finished jobs

    def emit(self, call: Callable[[], None]) -> None:
        self.events.append(call)

    # --- transitions ------------------------------------------------------------------
    def add(self, job: ScheduledJob, now: float) -> None:
        """Queue a new job (O(log n): the waiting index keeps start order)."""
        self.jobs[job.id] = job
        self.queue.add(job, now)
        self.publish(job, JobState.QUEUED, now)

    def start(self, job: ScheduledJob, now: float) -> None:
        self.queue.discard(job)
        self.reserved.pop(job.id, None)
        self.started.add(job, now)
        job.state, job.started = JobState.RUNNING, now
        job.timings["queue"] = now - job.arrival
        self.publish(job, JobState.RUNNING, now)
        self.advance(job, now)

    def advance(self, job: ScheduledJob, now: float) -> None:
        """Move a job to its next stage (skipping device stages with nothing to run)."""
        while True:
            try:
                stage = job.work.next_stage()
            except Exception as exc:  # the work could not say what comes next
                self.stop(job, JobState.FAILED, now, exc)
                return
            if stage is None:
                self.stop(job, JobState.SUCCEEDED, now)
                return
            if isinstance(stage, CpuStage):
                job.stage = stage
                return
            job.devices_reached.add(stage.model.name)
            if self.breakers.is_open(stage.model.name):
                self.stop(job, JobState.FAILED, now, self.unavailable(stage.model.name))
                return
            total = stage.task.total_batches
            if total > 0:
                job.step = StepProgress(stage, total)
                return
            job.step = None

    def step_done(self, job: ScheduledJob, now: float) -> None:
        if job.active and job.step is not None and job.step.finished:
            job.step = None
            self.advance(job, now)

    def retry_or_fail(
        self, job: ScheduledJob, error: Exception, now: float, requeue: Callable[[], None]
    ) -> None:
        """Re-run the failed unit (``requeue``) if the error is retryable and the job has
        retries left, after ``retry_backoff_s`` (the job gets no work until then); else
        fail the job."""
        if not job.active:
            return
        if isinstance(error, RadserveError) and error.outage:  # bounded by the job timeout
            job.not_before = max(job.not_before, now + max(self.limits.retry_backoff_s, 1.0))
            requeue()
            logger.warning(
                "job %s: %s (%s); its step is tried again in %.1f s",
                job.id,
                error.message,
                error.code,
                job.not_before - now,
            )
            return
        retryable = isinstance(error, RadserveError) and error.retryable
        if retryable and job.retries < self.limits.max_retries:
            job.retries += 1
            job.not_before = max(job.not_before, now + self.limits.retry_backoff_s)
            requeue()
            logger.warning(
                "job %s: retryable %s, retry %d of %d in %.1f s",
                job.id,
                getattr(error, "code", type(error).__name__),
                job.retries,
                self.limits.max_retries,
                self.limits.retry_backoff_s,
            )
            return
        self.stop(job, JobState.FAILED, now, error)

    def stop(
        self, job: ScheduledJob, state: JobState, now: float, error: Exception | None = None
    ) -> None:
        """Mark a job for ``state``; it is final once nothing of it is in flight."""
        if not job.active:
            return
        code = message = None
        if isinstance(error, RadserveError):
            code, message = error.code, error.message
        elif error is not None:
            # the exception's text as the log redacts a library's: it may quote a file's
            # path or a zip member's name the sender chose ("Bad CRC-32 for file
            # 'DOE^JOHN/1.dcm'"), and the job's error is shown to every reader of the job
            code = "internal_error"
            message = (
                f"unexpected {type(error).__name__}: {redact(str(error))} (a radserve "
                f"defect; the server's log has the details under job {job.id})"
            )
            logger.error("job %s: unexpected %s", job.id, type(error).__name__, exc_info=error)
        job.stopping = (state, code, message)
        self.queue.discard(job)
        self.reserved.pop(job.id, None)
        self.started.discard(job)
        if job.step is not None:
            self.prepared -= len(job.step.ready)
            job.step.ready.clear()
            job.step.to_merge.clear()
        self.settle(job, now)

    def settle(self, job: ScheduledJob, now: float) -> None:
        """Publish a stopping job's terminal state once nothing of it is in flight."""
        if job.active or job.inflight or job.state.terminal:
            return
        assert job.stopping is not None
        state, code, message = job.stopping
        result = None
        if state is JobState.SUCCEEDED:
            try:
                result = job.work.result()
            except Exception as exc:
                state, code, message = JobState.FAILED, "internal_error", str(exc)
        job.state = state
        if job.started is not None:
            job.timings["run"] = now - job.started
        job.timings["total"] = now - job.arrival
        if state is not JobState.CANCELLED and now > job.deadline and not job.missed:
            self.miss(job, now)
        if state is JobState.SUCCEEDED and job.started is not None:
            seconds, old = now - job.started, self.service_s
            self.service_s = seconds if old is None else old + _SERVICE_EWMA * (seconds - old)
        del self.jobs[job.id]
        self.publish(job, state, now, code=code, message=message, result=result)
        paused = job.timings.get("paused", 0.0)
        logger.info(
            "job %s %s%s after %.1f s%s",
            job.id,
            state.value,
            f" ({code})" if code else "",
            job.timings["total"],
            f" ({paused:.1f} s of it paused for URGENT work)" if paused > 0 else "",
        )

    def publish(
        self,
        job: ScheduledJob,
        state: JobState,
        now: float,
        *,
        code: str | None = None,
        message: str | None = None,
        result: object = None,
    ) -> None:
        timings = dict(job.timings) if state.terminal else {}
        event = JobEvent(
            job.id, state, job.cls, now, job.deadline, timings, code, message, job.retries, result
        )
        self.emit(lambda: self.hooks.on_state(event))

    # --- units of work (the job table is under the scheduler lock) -------------------
    def stage_unit(
        self, jobs: list[ScheduledJob], now: float, order: list[ScheduledJob]
    ) -> CpuDispatch | None:
        """A CPU stage of the best job that has one, starting waiting jobs as allowed:
        URGENT at once; a routine job while fewer than ``max_running`` routine jobs run,
        and no slot is held for a job of its class or a better one (:meth:`held_for`)."""
        started = self.routine_started()
        holder = self.slot_holder()
        for job in jobs:
            if job.state is JobState.QUEUED:
                if not may_start(job.cls, started, self.config) or self.held_for(job, holder):
                    continue
                started += job.cls is not PriorityClass.URGENT
                self.start(job, now)
                if not job.active:
                    continue
                if (unit := self.feed_unit(job, now, order)) is not None:
                    return unit  # its first stage was a device stage
            if job.stage is not None and not job.stage_busy:
                job.stage_busy = True
                job.inflight += 1
                return StageDispatch(job.id, job.stage, now)
        return None

    def feed_unit(
        self, job: ScheduledJob, now: float, order: list[ScheduledJob]
    ) -> CpuDispatch | None:
        """A merge (first: it frees memory) or a batch preparation for ``job``."""
        step = job.step
        if step is None or not job.active:
            return None
        if step.to_merge and not step.merging:
            batch, output = step.to_merge.popleft()
            step.merging = True
            job.inflight += 1
            return MergeDispatch(job.id, step.stage, batch, output, now)
        if may_prepare(
            job,
            preparing=step.preparing,
            exhausted=step.exhausted,
            ready=len(step.ready),
            blocked=self.breakers.is_open(step.stage.model.name),
            prepared=self.prepared,
            holding=((o, o.step is not None and bool(o.step.ready)) for o in order),
            config=self.config,
        ):
            step.preparing = True
            self.prepared += 1
            job.inflight += 1
            return PrepareDispatch(job.id, step.stage, now)
        return None

    # --- breakers, deadlines, timeouts -----------------------------------------------
    def unavailable(self, model: str) -> ModelUnavailableError:
        return ModelUnavailableError(
            f"model {model} failed {self.breakers.failures(model)} times in a row; it takes "
            "no jobs until it is reloaded (reset_model)",
            model=model,
        )

    def model_failed(self, model: str, error: Exception, now: float) -> None:
        """Count a failure against ``model``; on opening its breaker fail every job that
        needs it."""
        if not self.breakers.failure(model):
            return
        logger.error(
            "model %s circuit breaker open after %d failures in a row (last: %s)",
            model,
            self.breakers.failures(model),
            getattr(error, "code", type(error).__name__),
        )
        unavailable = self.unavailable(model)
        for job in list(self.jobs.values()):
            uses = job.step is not None and job.step.stage.model.name == model
            if job.active and (uses or model in job.work.models):
                self.stop(job, JobState.FAILED, now, unavailable)

    def miss(self, job: ScheduledJob, now: float) -> DeadlineMiss:
        job.missed = True
        self.misses[job.cls] += 1
        miss = DeadlineMiss(job.id, job.cls, job.deadline, now)
        logger.warning(
            "job %s (%s) missed its deadline by %.1f s", job.id, job.cls.name, miss.late_by
        )
        self.emit(lambda: self.hooks.on_deadline_miss(miss))
        return miss

    def check_deadlines(self, now: float) -> list[DeadlineMiss]:
        late = [j for j in self.jobs.values() if j.active and not j.missed and now > j.deadline]
        return [self.miss(job, now) for job in late]

    def check_timeouts(self, now: float) -> list[str]:
        limit = self.limits.timeout_s
        expired = [
            j
            for j in self.jobs.values()
            if j.active and j.started is not None and now - j.started > limit
        ]
        for job in expired:
            ran = now - (job.started or now)
            error = JobTimeoutError(
                f"job ran {ran:.0f} s, over the {limit:.0f} s job timeout; "
                "it was stopped at its next batch boundary"
            )
            self.stop(job, JobState.FAILED, now, error)
        return [j.id for j in expired]

    # --- queue views ------------------------------------------------------------------
    def changed(self, job: ScheduledJob, now: float) -> None:
        """``job``'s class, deadline or promotion changed: its rank in the indexes too."""
        self.queue.changed(job, now)
        self.started.changed(job, now)

    def waiting(self, now: float) -> list[ScheduledJob]:
        """Jobs not yet started, in the order they would start (the waiting index: the
        same order as sorting them by ``rank(now)``, without the sort)."""
        return self.queue.ordered(now)

    def active(self, now: float) -> list[ScheduledJob]:
        """Every active job, best-ranked first: the two indexes merged (O(n), no sort;
        the same order as sorting them by ``rank(now)``)."""
        merged = heapq.merge(self.queue.entries(now), self.started.entries(now))
        return [job for _, job in merged]

    def ranked(self, now: float) -> list[ScheduledJob]:
        """The active jobs eligible for work, best first (:func:`selection.eligible`)."""
        return eligible(self.active(now), now, self.config, urgent_active=self.urgent_active(now))

    def urgent_active(self, now: float) -> bool:
        """Whether URGENT work can run now: the one definition behind both
        ``yield_to_urgent`` (routine CPU units pause) and ``urgent_exclusive`` (routine
        jobs get no new work). A genuine URGENT job counts while it has work in flight,
        or is waiting or started with work it could be given now; one backing off after
        a retryable failure (until its ``not_before``) or held at a model whose breaker
        is open does not, so a PACS outage or a broken URGENT model never stalls the
        routine queue. A job aged into the URGENT class never counts.

        Cheap: the genuine URGENT jobs are a prefix of each rank index."""
        urgent = PriorityClass.URGENT
        if not self.queue.count(urgent) + self.started.count(urgent):
            return False
        for index in (self.queue, self.started):
            for _, job in index.entries(now):
                if job.cls is not urgent:
                    break  # an aged routine job, then the routine ones: no more URGENT
                if self._can_run(job, now):
                    return True
        return False

    def _can_run(self, job: ScheduledJob, now: float) -> bool:
        if job.inflight:
            return True
        if job.not_before > now:
            return False
        step = job.step
        return not (step is not None and self.breakers.is_open(step.stage.model.name))

    def order(self, now: float) -> list[QueuedJob]:
        """Every active job, best-ranked first: the order work is handed out in (with
        ``urgent_exclusive`` routine work also waits while URGENT work can run)."""
        return [
            QueuedJob(
                j.id,
                j.cls,
                j.effective(now, self.config),
                j.started is not None,
                j.arrival,
                j.deadline,
                j.started,
                j.promoted,
                tuple(j.timings.items()) if j.started is not None else (),
            )
            for j in self.active(now)
        ]

    def slot_holder(self) -> ScheduledJob | None:
        """The reserved waiting job the next free routine slot is held for: of the best
        class among them (its own class, not an aged one), the earliest deadline."""
        routine = [j for j in self.reserved.values() if j.cls is not PriorityClass.URGENT]
        return min(routine, key=lambda j: (j.cls.rank, j.deadline, j.seq), default=None)

    @staticmethod
    def held_for(job: ScheduledJob, holder: ScheduledJob | None) -> bool:
        """Whether waiting ``job`` may not start because the slot is ``holder``'s: it is
        another job of the holder's class or a lower one (aged or not). A better class's
        job and URGENT work are never held back."""
        return holder is not None and holder is not job and job.cls.rank >= holder.cls.rank

    def routine_started(self) -> int:
        """Started, unfinished non-URGENT jobs (each may hold a loaded volume)."""
        urgent = PriorityClass.URGENT
        return sum(1 for j in self.jobs.values() if j.started is not None and j.cls is not urgent)

    def retry_after(self) -> int:
        """Seconds until a waiting slot is likely to free: one job's run time spread over
        the jobs running in parallel (a rough, honest estimate)."""
        if self.service_s is None:
            return self.config.default_retry_after_s
        running = max(1, sum(1 for j in self.jobs.values() if j.started is not None))
        return int(min(600, max(1, math.ceil(self.service_s / running))))

    def info(self, job_id: str, now: float) -> JobInfo | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return JobInfo(
            job.id,
            job.state,
            job.cls,
            job.effective(now, self.config),
            job.deadline,
            job.deadline - now,
            self.queue.position(job, now),
            job.missed,
            job.retries,
        )

    def snapshot(self, now: float) -> SchedulerSnapshot:
        queued = dict.fromkeys(PriorityClass, 0)
        running = dict.fromkeys(PriorityClass, 0)
        for job in self.jobs.values():
            (queued if job.state is JobState.QUEUED else running)[job.cls] += 1
        return SchedulerSnapshot(
            at=now,
            queued=queued,
            running=running,
            positions={j.id: i for i, j in enumerate(self.waiting(now))},
            deadline_misses={c: self.misses[c] for c in PriorityClass},
            open_models=self.breakers.open_models(),
            prepared_batches=self.prepared,
        )


__all__ = ["JobBook"]
