"""The clinical-priority scheduler: which unit of which job runs next, and what follows.

Deterministic given its clock and the order of calls, and free of threads: executors
ask it for work (``next_cpu_dispatch`` for the CPU pool, ``next_dispatch(device)`` for a
device), run it, and report back with ``complete``. A watchdog calls ``tick`` at least
once a second, so deadline misses and timeouts are seen while a device is busy, not
when the next batch forms.

- Every choice takes the best-ranked job that has work of the kind asked for, so an
  URGENT job overtakes routine ones at the next batch boundary
  (:mod:`radserve.scheduling.selection`).
- Retryable errors re-run the failed unit after ``jobs.retry_backoff_s``, up to
  ``jobs.max_retries`` per job; consecutive model failures open the model's circuit
  breaker, failing every job that needs it.
- A job that must end (cancelled, failed, timed out) stops at its next batch boundary
  (:mod:`radserve.scheduling.book`).
- While URGENT work can run (``yield_to_urgent``; an URGENT job waiting or running, not
  one backing off or held at an open breaker), routine CPU stages already
  running pause at their next :func:`~radserve.checkpoints.checkpoint`: executors run a
  routine unit with :meth:`Scheduler.wait_routine` as its waiter (:meth:`yields`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from radserve.config import JobSettings, SchedulerSettings
from radserve.domain.priority import PriorityClass, PriorityRules
from radserve.errors import DeviceMemoryError, ModelError, RadserveError
from radserve.scheduling.book import JobBook
from radserve.scheduling.clock import Clock, MonotonicClock
from radserve.scheduling.dispatch import (
    BatchDispatch,
    BatchPart,
    CpuDispatch,
    Dispatch,
    DispatchOutcome,
    MergeDispatch,
    PrepareDispatch,
    StageDispatch,
)
from radserve.scheduling.errors import (
    DuplicateJobError,
    JobCancelledError,
    NotWaitingError,
    QueueFullError,
)
from radserve.scheduling.jobs import (
    BatchEvent,
    DeadlineMiss,
    Hold,
    JobHooks,
    JobInfo,
    JobRequest,
    JobState,
    JobTicket,
    NullHooks,
    QueuedJob,
    Reprioritised,
    SchedulerSnapshot,
)
from radserve.scheduling.selection import plan_batch
from radserve.scheduling.state import ReadyBatch, ScheduledJob

logger = logging.getLogger(__name__)

URGENT = PriorityClass.URGENT


class Scheduler:
    """Jobs in, dispatch decisions out; thread-safe, hooks called outside the lock."""

    def __init__(
        self,
        config: SchedulerSettings | None = None,
        *,
        jobs: JobSettings | None = None,
        rules: PriorityRules | None = None,
        clock: Clock | None = None,
        hooks: JobHooks | None = None,
    ) -> None:
        # the settings sections themselves (scheduler, jobs, priority_rules): no mapping
        self.config = config if config is not None else SchedulerSettings()
        self.jobs = jobs if jobs is not None else JobSettings()
        self.rules = rules if rules is not None else PriorityRules()
        self.clock: Clock = clock or MonotonicClock()
        self._book = JobBook(self.config, self.jobs, hooks or NullHooks())
        self._lock = threading.RLock()
        self._emit_lock = threading.RLock()
        self._listeners: list[Callable[[], None]] = []
        self._seq = itertools.count()
        # True while a routine batch is held for a compatible one being prepared: the
        # executor then asks again after ``max_queue_delay_s`` instead of sleeping.
        self.holding = False
        # Set while routine work may run; cleared while URGENT work can run
        # (``yield_to_urgent``): what routine units wait for at their checkpoints.
        self._routine_gate = threading.Event()
        self._routine_gate.set()
        # why no new unit is handed out now, since when (:meth:`hold`); None: work goes on
        self.held: Hold | None = None

    # --- plumbing ---------------------------------------------------------------------
    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs after every change that may make new work available."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    @contextmanager
    def _locked(self, *, notify: bool = True) -> Iterator[float]:
        try:
            with self._lock:
                yield self.clock.now()
        finally:
            self._flush(notify)

    def _flush(self, notify: bool) -> None:
        """Make the queued hook calls in order, outside the scheduler lock; then tell the
        listeners, if anything changed (else idle workers would wake each other forever)."""
        events = self._book.events
        with self._lock:
            self._update_gate()
        with self._emit_lock:
            while True:
                with self._lock:
                    if not events:
                        break
                    call = events.popleft()
                notify = True
                try:
                    call()
                except Exception:  # a broken hook must not stop scheduling
                    logger.exception("scheduler hook failed")
        if notify:
            for listener in list(self._listeners):
                listener()

    @contextmanager
    def _dispatching(self) -> Iterator[tuple[float, list[Dispatch]]]:
        """Lock for a dispatch decision: listeners hear of it only if a unit was handed
        out (it may free room for more) or a state changed."""
        handed: list[Dispatch] = []
        try:
            with self._lock:
                yield self.clock.now(), handed
        finally:
            self._flush(bool(handed))

    def _update_gate(self) -> None:
        """Close the routine checkpoints while URGENT work can run
        (:meth:`JobBook.urgent_active`: not while the URGENT job backs off after a
        retryable failure or waits at an open breaker; a job aged into the URGENT class
        is routine here: it yields to a genuine one). Updated on every scheduling event
        and at least every watchdog tick, so a back-off that ends closes it again."""
        if self.config.yield_to_urgent and self._book.urgent_active(self.clock.now()):
            self._routine_gate.clear()
        else:
            self._routine_gate.set()

    def yields(self, dispatch: Dispatch) -> bool:
        """Whether ``dispatch`` is routine CPU work, which pauses at its checkpoints while
        URGENT work can run (device batches never pause: they are one call)."""
        if isinstance(dispatch, BatchDispatch):
            return False
        with self._lock:
            job = self._book.jobs.get(dispatch.job_id)
            return job is not None and job.cls is not URGENT

    def wait_routine(self, timeout: float | None = None) -> bool:
        """Block while routine work must yield to an URGENT job; True once it may run,
        False if ``timeout`` passed first."""
        return self._routine_gate.wait(timeout)

    @property
    def idle(self) -> bool:
        """No job is waiting, running or stopping."""
        with self._lock:
            return not self._book.jobs

    # --- admission --------------------------------------------------------------------
    def submit(self, request: JobRequest) -> JobTicket:
        """Queue a job. Raises :class:`QueueFullError` (routine work only) or
        :class:`ModelUnavailableError` (a model it needs has an open breaker)."""
        book = self._book
        with self._locked() as now:
            if request.job_id in book.jobs:
                raise DuplicateJobError(f"job {request.job_id} is already scheduled")
            cls = request.priority
            if cls is None:
                cls = self.rules.classify(request.attributes)
            for model in request.work.models:
                if book.breakers.is_open(model):
                    raise book.unavailable(model)
            limit = self.config.queue_limit(cls)
            if limit is not None and not request.resume:
                waiting = book.queue.count(cls)
                if waiting >= limit:
                    retry_after = book.retry_after()
                    raise QueueFullError(
                        f"the {cls.name.lower()} queue is full ({waiting} studies waiting, "
                        f"limit {limit}); retry after {retry_after} s",
                        retry_after=retry_after,
                    )
            arrival = now - max(0.0, request.age_s)
            deadline = arrival + self.config.tat(cls)
            if request.deadline_in_s is not None:  # the job row's (JobRequest)
                deadline = now + request.deadline_in_s
            job = ScheduledJob(
                id=request.job_id,
                cls=cls,
                work=request.work,
                arrival=arrival,
                deadline=deadline,
                seq=next(self._seq),
            )
            book.add(job, now)
            logger.info(
                "job %s queued as %s, deadline in %.0f s", job.id, cls.name, job.deadline - now
            )
            position = book.queue.position(job, now)
            assert position is not None
            return JobTicket(job.id, cls, job.deadline, position)

    def hold(self, reason: str, message: str) -> None:
        """Hand out no new unit of any job until :meth:`release` (units running finish):
        the server cannot prove it still holds its jobs (radserve.service.leases).
        ``reason``: a stable code (the metric's label); ``message``: for /readyz."""
        with self._locked(notify=False) as now:
            if self.held is None or self.held.reason != reason:
                self.held = Hold(reason, message, now)

    def release(self) -> None:
        """Hand out work again after :meth:`hold`; the workers are woken."""
        with self._locked():
            self.held = None

    def fail(self, job_id: str, error: RadserveError) -> bool:
        """Fail an unfinished job with ``error`` (running: at its next batch boundary)."""
        with self._locked() as now:
            job = self._book.jobs.get(job_id)
            if job is None or not job.active:
                return False
            self._book.stop(job, JobState.FAILED, now, error)
            return True

    def cancel(self, job_id: str) -> bool:
        """Cancel a waiting or running job (running: at its next batch boundary)."""
        with self._locked() as now:
            job = self._book.jobs.get(job_id)
            if job is None or not job.active:
                return False
            error = JobCancelledError("cancelled by request")
            self._book.stop(job, JobState.CANCELLED, now, error)
            return True

    def reprioritise(self, job_id: str, cls: PriorityClass) -> Reprioritised:
        """Re-file a waiting job under ``cls``: its deadline becomes arrival + ``cls``'s
        TAT, and it takes its place among the waiting jobs by the usual rank.

        The deadline is counted from the job's *arrival*, not from now: the turnaround
        target is the time from the study's arrival to its result, whichever class it is
        filed under, so a study raised to URGENT after 40 minutes is 40 minutes into its
        URGENT window (possibly already late, and then counted as a miss), and one lowered
        to OUTPATIENT gains no fresh window it never had. It is also what restart recovery
        computes from the stored class and arrival, so a restart keeps the same deadline.

        Queue limits are not applied (the job was admitted already). A miss already
        counted stays counted; a deadline-risk promotion stays. Raises
        :class:`NotWaitingError` unless the job is waiting (not started, not stopping).
        """
        with self._locked() as now:
            job = self._book.jobs.get(job_id)
            if job is None or not job.active or job.state is not JobState.QUEUED:
                why = (
                    "is not waiting in the queue (finished, or not yet handed over)"
                    if job is None or not job.active
                    else "has started: its class no longer changes where it runs"
                )
                raise NotWaitingError(
                    f"job {job_id} {why}; only waiting jobs can be re-prioritised"
                )
            old_cls, old_deadline = job.cls, job.deadline
            job.cls = cls
            job.deadline = job.arrival + self.config.tat(cls)
            self._book.changed(job, now)  # its rank key and per-class count
            logger.info(
                "job %s re-prioritised %s -> %s, deadline in %.0f s",
                job.id,
                old_cls.name,
                cls.name,
                job.deadline - now,
            )
            position = self._book.queue.position(job, now)
            assert position is not None
            return Reprioritised(job.id, old_cls, cls, old_deadline, job.deadline, position)

    def reset_model(self, name: str) -> bool:
        """Close ``name``'s circuit breaker (call after reloading it); True if it was open."""
        with self._locked():
            reopened = self._book.breakers.reset(name)
            if reopened:
                logger.info("model %s circuit breaker reset: it takes jobs again", name)
            return reopened

    def open_models(self) -> tuple[str, ...]:
        """Models whose breaker is open (for /readyz)."""
        return self._book.breakers.open_models()

    # --- dispatch ---------------------------------------------------------------------
    def next_cpu_dispatch(
        self, *, urgent_only: bool = False, feed_only: bool = False
    ) -> CpuDispatch | None:
        """The CPU pool's next unit, best class first. Within a class, work that feeds a
        device (merging outputs, preparing batches) goes before CPU stages (ingest,
        post-processing, reports), best job first: a short preparation must not wait
        behind a long stage while the device idles.

        Starts waiting jobs while fewer than ``max_running`` routine jobs have started
        (URGENT always starts). ``urgent_only`` serves an executor's URGENT lane (a
        thread kept free of routine work, so an emergency's ingest never waits for a
        long routine stage); ``feed_only`` a device's feeder thread.
        """
        book = self._book
        with self._dispatching() as (now, handed):
            if self.held is not None:
                return None
            order = book.ranked(now)
            if urgent_only:
                order = [j for j in order if j.cls is URGENT]
            tiers: dict[PriorityClass, list[ScheduledJob]] = {}
            for job in order:
                tiers.setdefault(job.effective(now, self.config), []).append(job)
            for jobs in tiers.values():
                for job in jobs:
                    if (unit := book.feed_unit(job, now, order)) is not None:
                        handed.append(unit)
                        return unit
                if not feed_only and (unit := book.stage_unit(jobs, now, order)) is not None:
                    handed.append(unit)
                    return unit
            return None

    def next_tail_dispatch(self) -> StageDispatch | None:
        """While the executor stops: the next CPU stage of a started job with no device
        work left (:attr:`ScheduledJob.in_tail`: its post-processing, report, lineage,
        DICOM results, publishing), best job first, so a job whose inference is done
        gets its result recorded before the process exits instead of running again
        from its ingest after the restart. Nothing else is handed out: no job starts,
        no batch is prepared or run."""
        book = self._book
        with self._dispatching() as (now, handed):
            if self.held is not None:
                return None
            for _, job in book.started.entries(now):
                if (
                    job.active
                    and job.not_before <= now
                    and job.in_tail
                    and job.stage is not None
                    and not job.stage_busy
                ):
                    job.stage_busy = True
                    job.inflight += 1
                    unit = StageDispatch(job.id, job.stage, now)
                    handed.append(unit)
                    return unit
            return None

    @property
    def in_flight(self) -> bool:
        """Whether a unit of any job is being executed (a stopping executor's tail
        stages may follow it)."""
        with self._lock:
            return any(job.inflight for job in self._book.jobs.values())

    def next_dispatch(self, device: str) -> BatchDispatch | None:
        """``device``'s next batch: the best-ranked ready batch plus compatible ones."""
        book = self._book
        with self._dispatching() as (now, handed):
            if self.held is not None:
                return None
            order = book.ranked(now)
            plan = plan_batch(order, now, self.config, book.breakers)
            self.holding = plan is not None and plan.hold
            if plan is None or plan.hold:
                return None
            assert plan.lead.step is not None
            stage = plan.lead.step.stage
            parts: list[BatchPart] = []
            for job, count in plan.take:
                assert job.step is not None
                for _ in range(count):
                    parts.append(BatchPart(job.id, job.step.ready.popleft().batch))
                    job.step.on_device += 1
                    job.inflight += 1
                    book.prepared -= 1
            dispatch = BatchDispatch(device, stage.model, stage.session, tuple(parts), now)
            handed.append(dispatch)
            return dispatch

    # --- completion -------------------------------------------------------------------
    def complete(self, dispatch: Dispatch, outcome: DispatchOutcome) -> None:
        """Report a dispatched unit as done (``outcome.error`` None) or failed."""
        with self._locked() as now:
            if isinstance(dispatch, BatchDispatch):
                self._complete_batch(dispatch, outcome, now)
                return
            job = self._book.jobs[dispatch.job_id]
            job.inflight -= 1
            elapsed = now - dispatch.started
            if outcome.paused_s > 0:
                job.add_time("paused", outcome.paused_s)
            if isinstance(dispatch, StageDispatch):
                self._complete_stage(job, dispatch, outcome, elapsed, now)
            elif isinstance(dispatch, PrepareDispatch):
                self._complete_prepare(job, dispatch, outcome, elapsed, now)
            else:
                self._complete_merge(job, dispatch, outcome, elapsed, now)
            self._book.settle(job, now)

    def _complete_stage(
        self,
        job: ScheduledJob,
        d: StageDispatch,
        outcome: DispatchOutcome,
        elapsed: float,
        now: float,
    ) -> None:
        job.stage_busy = False
        job.add_time(d.stage.name, elapsed)
        if outcome.error is not None:
            self._book.retry_or_fail(job, outcome.error, now, lambda: None)
        elif job.active:
            job.stage = None
            self._book.advance(job, now)

    def _complete_prepare(
        self,
        job: ScheduledJob,
        d: PrepareDispatch,
        outcome: DispatchOutcome,
        elapsed: float,
        now: float,
    ) -> None:
        book, step = self._book, job.step
        assert step is not None
        step.preparing = False
        book.prepared -= 1
        job.add_time(f"{d.stage.name}: prepare", elapsed)
        if outcome.error is not None:
            book.retry_or_fail(job, outcome.error, now, lambda: None)
            return
        if outcome.value is None:  # the task had fewer batches than it announced
            step.exhausted, step.total = True, step.prepared
        else:
            step.prepared += 1
            step.exhausted = step.prepared >= step.total
            if job.active:
                step.ready.append(ReadyBatch(outcome.value, now))  # type: ignore[arg-type]
                book.prepared += 1
        book.step_done(job, now)

    def _complete_merge(
        self,
        job: ScheduledJob,
        d: MergeDispatch,
        outcome: DispatchOutcome,
        elapsed: float,
        now: float,
    ) -> None:
        book, step = self._book, job.step
        assert step is not None
        step.merging = False
        job.add_time(f"{d.stage.name}: merge", elapsed)
        if outcome.error is not None:
            if isinstance(outcome.error, ModelError):  # wrong outputs: the model's fault
                book.model_failed(d.stage.model.name, outcome.error, now)

            def requeue() -> None:
                step.to_merge.appendleft((d.batch, d.output))

            book.retry_or_fail(job, outcome.error, now, requeue)
            return
        # A batch counts as a success for the breaker once its output merged cleanly.
        book.breakers.success(d.stage.model.name)
        step.merged += 1
        book.step_done(job, now)

    def _complete_batch(self, d: BatchDispatch, outcome: DispatchOutcome, now: float) -> None:
        book = self._book
        elapsed = now - d.started
        jobs = [book.jobs[p.job_id] for p in d.parts]
        for job in jobs:
            assert job.step is not None
            job.step.on_device -= 1
            job.inflight -= 1
        distinct = list(dict.fromkeys(jobs))
        event = BatchEvent(d.device, d.model, d.items, len(distinct), elapsed, not outcome.error)
        book.emit(lambda: book.hooks.on_batch(event))
        if outcome.error is not None:
            for part, job in reversed(list(zip(d.parts, jobs, strict=True))):
                if job.active and job.step is not None:  # back to the front, to run again
                    job.step.ready.appendleft(ReadyBatch(part.batch, now))
                    book.prepared += 1
            if not isinstance(outcome.error, DeviceMemoryError):
                # out of memory at the smallest batch is the host's state (other models,
                # other studies): it opened the model's breaker like a faulty model
                book.model_failed(d.model.name, outcome.error, now)
            for job in distinct:
                book.retry_or_fail(job, outcome.error, now, lambda: None)
        else:
            outputs: list[np.ndarray] = outcome.value  # type: ignore[assignment]
            for part, job, out in zip(d.parts, jobs, outputs, strict=True):
                assert job.step is not None
                job.add_time(f"{job.step.stage.name}: infer", elapsed * part.items / d.items)
                if job.active:
                    job.step.to_merge.append((part.batch, out))
        for job in distinct:
            book.settle(job, now)

    # --- watchdog ---------------------------------------------------------------------
    def check_deadlines(self) -> list[DeadlineMiss]:
        """Jobs whose deadline passed since the last check."""
        with self._locked() as now:
            return self._book.check_deadlines(now)

    def tick(self) -> list[DeadlineMiss]:
        """One watchdog round (call at least once a second): misses, then timeouts."""
        with self._locked() as now:
            misses = self._book.check_deadlines(now)
            self._book.check_timeouts(now)
            return misses

    # --- introspection ----------------------------------------------------------------
    def runs(self, job_id: str) -> bool:
        """Whether ``job_id`` is unfinished here (cheaper than :meth:`job_info`)."""
        with self._lock:
            return job_id in self._book.jobs

    def unfinished(self) -> set[str]:
        """The ids of the jobs unfinished here."""
        with self._lock:
            return set(self._book.jobs)

    def job_info(self, job_id: str) -> JobInfo | None:
        """Where an unfinished job stands (None once it is terminal, or unknown)."""
        with self._lock:
            return self._book.info(job_id, self.clock.now())

    def queue_order(self) -> tuple[float, list[QueuedJob]]:
        """The clock reading and every unfinished job in the order work goes to them
        (the rank indexes merged, O(n)): what ETAs are walked over."""
        with self._lock:
            now = self.clock.now()
            return now, self._book.order(now)

    def promote(self, job_id: str) -> bool:
        """Run an active job ahead of the other jobs of its effective class (never ahead
        of a better class); True if it was not promoted already."""
        with self._locked() as now:
            job = self._book.jobs.get(job_id)
            if job is None or not job.active or job.promoted:
                return False
            job.promoted = True
            self._book.changed(job, now)
            logger.info("job %s promoted within its class (deadline risk)", job.id)
            return True

    def reserve(self, job_id: str) -> bool:
        """Hold the next free routine slot (``max_running``) for a waiting routine job:
        until it starts, no other job of its class or a lower one starts, aged into a
        better class or not; a better class's job and URGENT work still do. It is also
        promoted (:meth:`promote`), so once started it runs ahead of its class's work.
        True if the slot was not held for it already; a started, URGENT or unknown job:
        False (promote a started one instead).

        Where :meth:`promote` only moves the job to the front of its *effective* class,
        so a job of its own class that aged one class up still starts first, a
        reservation puts it ahead of every job of its own class and the lower ones."""
        with self._locked() as now:
            job = self._book.jobs.get(job_id)
            if (
                job is None
                or not job.active
                or job.state is not JobState.QUEUED
                or job.cls is URGENT
                or job_id in self._book.reserved
            ):
                return False
            self._book.reserved[job.id] = job
            if not job.promoted:
                job.promoted = True
                self._book.changed(job, now)
            logger.info("job %s holds the next free routine slot (deadline risk)", job.id)
            return True

    def snapshot(self) -> SchedulerSnapshot:
        """Queue depth and running jobs per class, waiting positions, misses, open models,
        the hold."""
        with self._lock:
            return dataclasses.replace(self._book.snapshot(self.clock.now()), held=self.held)


__all__ = ["Scheduler"]
