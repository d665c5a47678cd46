"""A discrete-event simulation (SimPy) of radserve's scheduling policy, for planning.

What is simulated is what :mod:`radserve.scheduling` does, at the grain that decides
turnaround:

- a job arrives (Poisson per class, or a replayed trace), gets ``deadline = arrival +
  TAT``, and waits until it may start: when a CPU thread takes its first stage, as
  ``JobBook.stage_unit`` starts jobs (:func:`radserve.scheduling.selection.may_start`):
  URGENT at once, routine work while fewer than ``max_running`` routine jobs are
  started, and (``urgent_exclusive``) no other work while an URGENT job is unfinished.
  (Until 2026-12-03 any free worker started waiting jobs, so a job no thread could take
  yet held a ``max_running`` slot that a better class's later arrival then waited for);
- a started job runs a CPU stage (ingest), its device work as batches of at most
  ``batch_slices`` slices, then a CPU stage (post-processing and report); CPU stages
  take one of ``cpu_workers`` threads (plus, with ``urgent_lane``, one thread that
  takes URGENT work only, as the server's executor has), batches one of ``devices``;
- when the devices are the host's own cores (``host_cores``: a CPU device, whose
  runtime runs a batch on ``device_threads`` threads, every core by default), the
  cores are *shared* as the operating system shares them: every running unit (a batch:
  its threads, a CPU stage: one) progresses at ``min(1, cores / threads running)`` of
  its speed alone (processor sharing, :class:`_SharedCores`), so a batch and a CPU
  stage at once both slow down, neither waits for the other. (Until 2026-12-01 a batch
  *held* every core and waited for running CPU stages to end: on a 2-core host that
  over-predicted routine p50 TAT by 70-147 %: docs/history/turnaround.md);
- while URGENT work can run (``yield_to_urgent``), a routine CPU stage already running
  pauses (no progress, no core) until no URGENT job is unfinished, as the server's
  routine units wait at their checkpoints, and its thread runs URGENT CPU units
  meanwhile; device batches never pause;
- every free worker takes the best-ranked job that has work of its kind, with the
  scheduler's own ranking (:func:`radserve.scheduling.state.effective_class`: class
  after aging, then earliest deadline), so URGENT overtakes at the next batch boundary.

A job is, by default, that coarse sequence: batch preparation and merging are folded into
the last CPU stage. A :class:`JobService` with ``models`` (:func:`radserve.turnaround.units
.fine_service`, ``ModelSampler(fine=True)``) is the server's own units instead: per model
each batch prepared (CPU), run (device) and merged (CPU), the model's post-processing,
then the report; a CPU thread takes, per effective class best first, *feed* work
(merges, then preparations up to ``lookahead_batches`` per job and
``max_prepared_batches`` in all) of the best job that has some before any CPU stage
(``feed_first``), as ``Scheduler.next_cpu_dispatch`` does, and each device has a
*feeder* thread that takes feed work only (``feeder``: the executor's
``radserve-feed-<device>``; simulated since 2026-12-03). Not the default: on the
recorded traces it plans every Zen 4 cell (2bd52b1, 7130cc0) and one cell fewer on
session 11's host (8b6d7eb, 5cb504f) than the coarse job (docs/history/turnaround.md,
sessions 13 and 15).

Not simulated: dynamic batching of several studies into one device call, retries and
failures, memory. Deterministic for a seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.scheduling.selection import may_prepare, may_start
from radserve.scheduling.state import effective_class
from radserve.turnaround.waiting import WaitingJobs

URGENT = PriorityClass.URGENT
# threads of one kind started with the simulation; more only as they are needed (_run:
# one idle thread of each kind always stands by). Each idle thread is woken by every
# change: 1,024 devices' 768 threads started at once cost 237 s for 2,000 jobs, 22 s so
EAGER_THREADS = 4


@dataclass(frozen=True)
class ModelWork:
    """One model's part of a job in the server's own units (``JobBook.feed_unit`` /
    ``stage_unit``): per batch a CPU preparation, the device call and a CPU merge (the
    two CPU ones *feed* work, handed out before any stage of the same class), then the
    model's post-processing as one CPU stage. ``prepare_s`` / ``merge_s`` empty: the
    batches are ready at once and need no merge (the coarse model, which folds that
    work into the job's last stage)."""

    batches_s: tuple[float, ...]
    prepare_s: tuple[float, ...] = ()
    merge_s: tuple[float, ...] = ()
    post_s: float = 0.0


@dataclass(frozen=True)
class JobService:
    """One job's work (seconds): CPU before the device, device batches, CPU after.

    With ``models`` (:func:`fine_service`) the device work is those models' units in
    order, ``batches_s`` their device batches all together (for the load and the
    busy counts), ``cpu_post_s`` the report stage after the last model."""

    cpu_pre_s: float
    batches_s: tuple[float, ...]
    cpu_post_s: float
    models: tuple[ModelWork, ...] = ()

    def segments(self) -> list[float | ModelWork]:
        """The job's sequence: CPU stages (seconds) and models' device steps."""
        if not self.models:
            steps: list[float | ModelWork] = [self.cpu_pre_s]
            if self.batches_s:
                steps.append(ModelWork(self.batches_s))
            return [*steps, self.cpu_post_s]
        out: list[float | ModelWork] = [self.cpu_pre_s]
        for model in self.models:
            if model.batches_s:
                out.append(model)
            out.append(model.post_s)
        return [*out, self.cpu_post_s]


ServiceSampler = Callable[[np.random.Generator, PriorityClass], JobService]


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the start of the simulation
    cls: PriorityClass
    service: JobService | None = None  # None: drawn from the sampler
    # counted in the statistics (False: a benchmark's unmeasured arrival that only keeps
    # the stream going around the measured ones)
    measured: bool = True


@dataclass(frozen=True)
class SimConfig:
    """The host and policy simulated."""

    devices: int = 1
    cpu_workers: int = 2
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    # the devices run on the host's cores (a CPU device): how many cores in all
    host_cores: int | None = None
    # threads a batch runs on when the device is the host's cores (None: host_cores /
    # devices, as the server's CPU runtime sets intra-op threads to the cores)
    device_threads: int | None = None
    # one more CPU thread that takes URGENT work only (the server's executor has one)
    urgent_lane: bool = True
    # within a class, work that feeds a device (preparing, merging batches) before CPU
    # stages, as the server hands it out (False: one order, best job first)
    feed_first: bool = True
    # a thread per device that takes feed work only (preparing, merging batches), as
    # the server's executor starts one beside each device's (radserve-feed-<device>)
    feeder: bool = True


@dataclass(frozen=True)
class ClassResult:
    cls: PriorityClass
    jobs: int
    tat_mean_s: float
    tat_p50_s: float
    tat_p95_s: float
    tat_p99_s: float
    wait_mean_s: float  # arrival -> start
    miss_rate: float

    def as_dict(self) -> dict[str, object]:
        return {
            "class": self.cls.value,
            "jobs": self.jobs,
            "tat_mean_s": round(self.tat_mean_s, 3),
            "tat_p50_s": round(self.tat_p50_s, 3),
            "tat_p95_s": round(self.tat_p95_s, 3),
            "tat_p99_s": round(self.tat_p99_s, 3),
            "wait_mean_s": round(self.wait_mean_s, 3),
            "deadline_miss_rate": round(self.miss_rate, 4),
        }


@dataclass(frozen=True)
class SimResult:
    classes: dict[PriorityClass, ClassResult]
    device_utilisation: float
    cpu_utilisation: float
    unfinished: int  # jobs still in the system when the simulation ended

    def as_dict(self) -> dict[str, object]:
        return {
            "classes": {c.value: r.as_dict() for c, r in self.classes.items()},
            "device_utilisation": round(self.device_utilisation, 4),
            "cpu_utilisation": round(self.cpu_utilisation, 4),
            "unfinished": self.unfinished,
        }


@dataclass(eq=False)
class _Step:
    """A model's device step under way: its batches prepared, on a device, merged."""

    work: ModelWork
    prepared: int = 0  # batches prepared or being prepared
    preparing: bool = False
    ready: int = 0  # prepared, not yet on a device
    sent: int = 0  # handed to a device
    on_device: int = 0
    to_merge: int = 0
    merging: bool = False
    merged: int = 0  # done (merged, or run where the model has no merges)

    def __post_init__(self) -> None:
        if not self.work.prepare_s:  # coarse: every batch ready at once
            self.prepared = self.ready = len(self.work.batches_s)

    @property
    def finished(self) -> bool:
        return self.merged >= len(self.work.batches_s)


@dataclass(eq=False)
class _Job:
    cls: PriorityClass
    arrival: float
    deadline: float
    seq: int
    service: JobService
    measured: bool = True
    started: float | None = None
    queued: bool = True
    segments: list[float | ModelWork] = field(default_factory=list)
    at: int = 0  # the segment under way
    stage_busy: bool = False
    step: _Step | None = None
    finished: float | None = None
    # it has feed work (batch preparations or merges) in some step: else :meth:`_Sim._feed`
    # has nothing for it ever, and the searches pass it by without asking
    feeds: bool = False
    # wall seconds its CPU units and its batches ran (paused ones included): what the
    # server's stage timings measure, the shared cores' slowdown in them
    cpu_wall: float = 0.0
    device_wall: float = 0.0

    @property
    def stage(self) -> float | None:
        """The CPU stage's seconds when the job is at one (None: at a device step)."""
        if self.queued or self.at >= len(self.segments) or self.step is not None:
            return None
        seg = self.segments[self.at]
        return None if isinstance(seg, ModelWork) else seg


# how long before its aging instant a job's rank is recomputed: far above the rounding of
# ``deadline - now`` (a deadline of a year in seconds is exact to ~1e-8 s)
_AGING_MARGIN_S = 1e-3
# a job's place in the scheduler's order (ScheduledJob.rank): effective class, an aged
# job behind the URGENT ones, deadline, arrival
_Key = tuple[int, bool, float, int]
# the eligible started jobs best first, the same per effective class, the URGENT ones
# alone, and each one's key
_Ranking = tuple[list[_Job], dict[PriorityClass, list[_Job]], list[_Job], dict[_Job, _Key]]


# the effective classes, best first
_TIERS = sorted(PriorityClass, key=lambda c: c.rank)


def _rank_key(job: _Job, eff: PriorityClass) -> _Key:
    return (eff.rank, eff is URGENT and job.cls is not URGENT, job.deadline, job.seq)


class _SharedCores:
    """The host's cores shared by the units running on them, as the OS shares them
    (processor sharing): a unit with ``threads`` threads and ``seconds`` of work alone
    progresses at ``min(1, cores / all running threads)`` of its solo speed (``cores``
    None: separate hardware, every unit at its solo speed). A unit run with ``yields``
    (a routine CPU stage) makes no progress and takes no core while :meth:`hold` is on,
    as the server's routine stages pause at their checkpoints (``yield_to_urgent``)."""

    def __init__(self, env: simpy.Environment, cores: int | None) -> None:
        self.env = env
        self.cores = cores
        # [solo seconds left, threads, done event, yields]
        self.running: list[list[Any]] = []
        self.last = 0.0
        self.version = 0
        self.held = False

    def run(self, seconds: float, threads: int, *, yields: bool = False) -> simpy.Event:
        """An event that fires when ``seconds`` of solo work on ``threads`` is done."""
        self._settle()
        done = self.env.event()
        self.running.append([seconds, threads, done, yields])
        self._schedule()
        return done

    def hold(self, held: bool) -> None:
        """Pause (True) or resume the yielding units."""
        if held != self.held:
            self._settle()
            self.held = held
            self._schedule()

    def _moving(self) -> list[list[Any]]:
        return [u for u in self.running if not (self.held and u[3])]

    def _speed(self) -> float:
        threads = sum(u[1] for u in self._moving())
        if self.cores is None or not threads:
            return 1.0
        return min(1.0, self.cores / threads)

    def _settle(self) -> None:
        elapsed, self.last = self.env.now - self.last, self.env.now
        speed = self._speed()
        for unit in self._moving():
            unit[0] -= elapsed * speed

    def _schedule(self) -> None:
        self.version += 1
        moving = self._moving()
        if not moving:
            return
        version = self.version
        wait = max(0.0, min(u[0] for u in moving) / self._speed())
        self.env.timeout(wait).callbacks.append(lambda _: self._due(version))

    def _due(self, version: int) -> None:
        if version != self.version:  # a unit started or ended since: rescheduled
            return
        self._settle()
        for unit in [u for u in self._moving() if u[0] <= 1e-9]:
            self.running.remove(unit)
            unit[2].succeed()
        self._schedule()


class _Sim:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.env = simpy.Environment()
        self.jobs: dict[int, _Job] = {}  # unfinished, by arrival sequence number
        # the unfinished ones: not started (per class, in the order they start), started
        self.waiting: WaitingJobs[_Job] = WaitingJobs(config.scheduler)
        self.started: list[_Job] = []
        self.routine_started = 0  # started routine jobs (may_start counts them)
        self.urgent_unfinished = 0
        self.done: list[_Job] = []
        self.changed = self.env.event()
        # threads per kind (device | cpu | urgent | feed): simulated, started, busy
        self.pool: dict[str, int] = {
            "device": config.devices,
            "cpu": config.cpu_workers,
            "urgent": int(config.urgent_lane),
            "feed": config.devices if config.feeder else 0,
        }
        self.spawned = dict.fromkeys(self.pool, 0)
        self.busy = dict.fromkeys(self.pool, 0)
        self.device_busy = 0.0
        self.cpu_busy = 0.0
        self.prepared = 0  # batches prepared (or being prepared), not yet on a device
        # bumped whenever a job arrives, starts or finishes (what is ranked changes)
        self.generation = 0
        self._ranked_gen = -1  # the generation self._ranking was computed for
        # before this instant no ranked job ages (effective_class), so the ranking holds
        self._steady_until = -math.inf
        self._ranking: _Ranking = ([], {}, [], {})
        # units taken and changes announced: with the clock, what a worker's search sees
        self.changes = 0
        self._idle_for: tuple[float, int] | None = None
        self._idle_kinds: set[str] = set()
        cores = config.host_cores
        self.cores = _SharedCores(self.env, cores)
        # threads a batch runs on: its device's share of the host
        default = 1 if cores is None else max(1, cores // max(1, config.devices))
        self.batch_threads = config.device_threads or default

    # --- the policy ---------------------------------------------------------------------
    def _ranked(self) -> _Ranking:
        """:meth:`_rank_now`, recomputed only when a job arrived, started or finished or
        the clock reached the first instant a started routine job may age
        (:attr:`_steady_until`): a rank is a function of the job (class, deadline,
        arrival) and of whether it has aged, not of its progress, and every worker woken
        by a change looked again (the planner spent most of its CPU re-sorting the same
        jobs for each of them)."""
        if self.generation != self._ranked_gen or not self.env.now < self._steady_until:
            self._ranked_gen, self._ranking = self.generation, self._rank_now()
        return self._ranking

    def _exclusive(self) -> bool:
        """``urgent_exclusive`` holds now: only URGENT jobs are eligible."""
        return self.config.scheduler.urgent_exclusive and self.urgent_unfinished > 0

    def _rank_now(self) -> _Ranking:
        """The eligible *started* jobs best first (the scheduler's ranking, with
        ``urgent_exclusive`` only URGENT ones while there are any), the same grouped by
        effective class, the URGENT ones alone (the URGENT lane's view) and their keys;
        notes when the first of them not yet aged may age. Waiting jobs are not ranked:
        they have no work but their first stage, and of them a CPU thread only ever
        starts each class's first (:meth:`_startable`)."""
        now, sched = self.env.now, self.config.scheduler
        jobs = self.started
        if self._exclusive():
            jobs = [j for j in jobs if j.cls is URGENT]
        keyed = []
        self._steady_until = math.inf
        for job in jobs:
            eff = effective_class(job.cls, job.deadline, now, sched)
            if eff is job.cls and eff is not URGENT:
                ages_at = job.deadline - sched.aging_fraction * sched.tat(job.cls)
                self._steady_until = min(self._steady_until, ages_at - _AGING_MARGIN_S)
            keyed.append((_rank_key(job, eff), eff, job))
        keyed.sort(key=lambda k: k[0])
        tiers: dict[PriorityClass, list[_Job]] = {}
        for _, eff, job in keyed:
            tiers.setdefault(eff, []).append(job)
        order = [job for _, _, job in keyed]
        keys = {job: key for key, _, job in keyed}
        return order, tiers, [j for j in order if j.cls is URGENT], keys

    def _startable(self, *, urgent_only: bool) -> dict[PriorityClass, tuple[_Key, _Job]]:
        """Per effective class, the best-ranked waiting job a CPU thread may start now
        (:func:`may_start`): of each class only its first waiting one, in the class it
        has aged into (radserve.turnaround.waiting: why no other could start first)."""
        now, sched = self.env.now, self.config.scheduler
        out: dict[PriorityClass, tuple[_Key, _Job]] = {}
        for cls in (URGENT,) if urgent_only or self._exclusive() else PriorityClass:
            first = self.waiting.first(cls, now)
            if first is None or not may_start(cls, self.routine_started, sched):
                continue
            job, eff = first
            key = _rank_key(job, eff)
            if eff not in out or key < out[eff][0]:
                out[eff] = (key, job)
        return out

    def _stage(
        self,
        jobs: list[_Job],
        order: list[_Job],
        keys: dict[_Job, _Key],
        waiting: tuple[_Key, _Job] | None,
        *,
        feed: bool,
    ) -> tuple[_Job, str] | None:
        """``JobBook.stage_unit`` for one effective class: the CPU stage (``feed``: or
        feed work) of the best of its started ``jobs`` that has one, unless the
        ``waiting`` job that may start ranks before it: that one starts now, as the
        scheduler starts a job only when a CPU thread takes its first stage."""
        for job in jobs:
            if waiting is not None and waiting[0] < keys[job]:
                break
            if feed and job.feeds and (unit := self._feed(job, order)) is not None:
                return job, unit
            if job.stage is not None and not job.stage_busy:
                return job, "stage"
        if waiting is None:
            return None
        job = waiting[1]
        self.waiting.start(job)
        self.started.append(job)
        self.routine_started += job.cls is not URGENT
        self.generation += 1
        job.started, job.queued = self.env.now, False
        return job, "stage"  # a job's first segment is a CPU stage

    def _feed(self, job: _Job, order: list[_Job]) -> str | None:
        """``JobBook.feed_unit``: a merge first (it frees memory), else a preparation."""
        step = job.step
        if step is None:
            return None
        if step.to_merge and not step.merging:
            return "merge"
        prepare = may_prepare(
            job,
            preparing=step.preparing,
            exhausted=step.prepared >= len(step.work.batches_s),
            ready=step.ready,
            blocked=False,  # no circuit breakers here: no model fails
            prepared=self.prepared,
            holding=((o, o.step is not None and o.step.ready > 0) for o in order),
            config=self.config.scheduler,
        )
        if prepare:
            return "prepare"
        return None

    def _take(self, kind: str) -> tuple[_Job, str] | None:
        """:meth:`_find`, skipped for a worker whose kind found nothing in this instant
        with nothing changed since (no unit taken or ended, no arrival): one change wakes
        every idle worker, and those of one kind would all search the same state."""
        key = (self.env.now, self.changes)
        if key != self._idle_for:
            self._idle_for, self._idle_kinds = key, set()
        if kind in self._idle_kinds:
            return None
        taken = self._find(kind)
        if taken is None:
            self._idle_kinds.add(kind)
        else:
            self.changes += 1  # the unit starts now: the jobs' state moves
        return taken

    def _find(self, kind: str) -> tuple[_Job, str] | None:
        """The next unit for a worker of ``kind`` (device | cpu | urgent), as the
        scheduler hands them out: the device the best-ranked ready batch; a CPU thread,
        per effective class best first, feed work of the best job that has some, else
        the stage of the best job at one (``Scheduler.next_cpu_dispatch``)."""
        order, tiers, urgent, keys = self._ranked()
        if kind == "device":
            for job in order:
                step = job.step
                if step is not None and step.ready and not step.on_device:
                    return job, "batch"
            return None
        if kind == "feed":
            for job in order:  # every class, best first: feed work only
                if job.feeds and (unit := self._feed(job, order)) is not None:
                    return job, unit
            return None
        if kind == "urgent":
            order, tiers = urgent, {URGENT: urgent}
        startable = self._startable(urgent_only=kind == "urgent")
        feed_first = self.config.feed_first
        for tier in _TIERS:
            jobs = tiers.get(tier, [])
            for job in jobs if feed_first else ():
                if job.feeds and (unit := self._feed(job, order)) is not None:
                    return job, unit
            waiting = startable.get(tier)
            taken = self._stage(jobs, order, keys, waiting, feed=not feed_first)
            if taken is not None:
                return taken
        return None

    def _notify(self) -> None:
        self.changes += 1
        sched = self.config.scheduler
        if sched.yield_to_urgent:  # routine CPU stages pause while URGENT work can run
            self.cores.hold(self.urgent_unfinished > 0)
        event, self.changed = self.changed, self.env.event()
        event.succeed()

    # --- processes ----------------------------------------------------------------------
    def arrivals(self, trace: Sequence[Arrival], sampler: ServiceSampler, rng: np.random.Generator):  # type: ignore[no-untyped-def]
        for seq, a in enumerate(trace):
            if a.at > self.env.now:
                yield self.env.timeout(a.at - self.env.now)
            service = a.service or sampler(rng, a.cls)
            tat = self.config.scheduler.tat(a.cls)
            job = _Job(a.cls, self.env.now, self.env.now + tat, seq, service, a.measured)
            job.segments = service.segments()
            job.feeds = any(m.prepare_s or m.merge_s for m in service.models)
            self.jobs[seq] = job
            self.waiting.add(job)
            self.urgent_unfinished += job.cls is URGENT
            self.generation += 1
            self._notify()

    def worker(self, kind: str):  # type: ignore[no-untyped-def]
        """A device or CPU-pool thread (``kind``: device | cpu | urgent, the URGENT
        lane). A CPU thread whose routine unit is paused for URGENT work lends itself
        to URGENT CPU work meanwhile, as the server's workers do at their checkpoints
        (:meth:`lender`)."""
        me = self.env.event()  # this thread's lender, woken while its unit is paused
        while True:
            taken = self._take(kind)
            if taken is None:
                yield self.changed
                continue
            job, unit = taken
            self.busy[kind] += 1
            if self.busy[kind] == self.spawned[kind] < self.pool[kind]:
                self.spawn(kind)  # every thread of the kind is busy: one more stands by
            routine = kind in ("cpu", "feed") and job.cls is not URGENT
            if routine:
                self.env.process(self.lender(me))
            yield from self._serve(job, unit, yields=routine)
            self.busy[kind] -= 1
            if routine:
                me.succeed()  # the lender stops once its unit ends
                me = self.env.event()

    def spawn(self, kind: str) -> None:
        """Start one more thread of ``kind`` (:meth:`worker`)."""
        self.spawned[kind] += 1
        self.env.process(self.worker(kind))

    def lender(self, done: simpy.Event):  # type: ignore[no-untyped-def]
        """URGENT CPU units run on a worker thread while its routine unit is paused
        (until ``done``: the unit ended; it cannot resume while the URGENT job the
        thread works for is unfinished, so the two never run at once)."""
        while not done.triggered:
            taken = self._take("urgent") if self.cores.held else None
            if taken is None:
                yield self.changed | done
                continue
            yield from self._serve(*taken, yields=False)

    def _serve(self, job: _Job, unit: str, *, yields: bool):  # type: ignore[no-untyped-def]
        """Run one unit of ``job`` (stage | prepare | batch | merge) and move it on."""
        step = job.step
        if unit == "stage":
            job.stage_busy = True
            seconds = job.stage or 0.0
        else:
            assert step is not None
            if unit == "prepare":
                seconds = step.work.prepare_s[step.prepared]
                step.preparing, step.prepared = True, step.prepared + 1
                self.prepared += 1
            elif unit == "batch":
                seconds = step.work.batches_s[step.sent]
                step.sent, step.ready, step.on_device = step.sent + 1, step.ready - 1, 1
                self.prepared -= bool(step.work.prepare_s)
            else:
                seconds = step.work.merge_s[step.merged]
                step.to_merge, step.merging = step.to_merge - 1, True
        if seconds > 0:
            threads = self.batch_threads if unit == "batch" else 1
            began = self.env.now
            yield self.cores.run(seconds, threads, yields=yields)
            if unit == "batch":
                job.device_wall += self.env.now - began
            else:
                job.cpu_wall += self.env.now - began
        if unit == "batch":
            self.device_busy += seconds
        else:
            self.cpu_busy += seconds
        if unit == "stage":
            job.stage_busy = False
            self._next_segment(job)
        elif step is not None:
            if unit == "prepare":
                step.preparing, step.ready = False, step.ready + 1
            elif unit == "batch":
                step.on_device = 0
                if step.work.merge_s:
                    step.to_merge += 1
                else:
                    step.merged += 1
            else:
                step.merging, step.merged = False, step.merged + 1
            if step.finished:
                job.step = None
                self._next_segment(job)
        self._notify()

    def _next_segment(self, job: _Job) -> None:
        job.at += 1
        if job.at >= len(job.segments):
            job.finished = self.env.now
            del self.jobs[job.seq]
            self.started.remove(job)
            self.routine_started -= job.cls is not URGENT
            self.urgent_unfinished -= job.cls is URGENT
            self.generation += 1
            self.done.append(job)
            return
        seg = job.segments[job.at]
        if isinstance(seg, ModelWork):
            job.step = _Step(seg)


def _run(
    trace: Sequence[Arrival],
    sampler: ServiceSampler,
    config: SimConfig,
    seed: int,
    until: float | None,
) -> _Sim:
    rng = np.random.default_rng(seed)
    sim = _Sim(config)
    env = sim.env
    env.process(sim.arrivals(sorted(trace, key=lambda a: a.at), sampler, rng))
    # the threads of each kind, up to EAGER_THREADS started now, the rest only once all
    # started ones are busy (_Sim.worker): every idle thread is woken by every change, so
    # --devices 1024 --cpu-workers 1024 (a million idle threads) simulated 38 jobs for
    # minutes in a gigabyte; an idle thread of a kind always stands by, as before
    for kind in ("device", "cpu", "urgent", "feed"):
        for _ in range(min(sim.pool[kind], EAGER_THREADS)):
            sim.spawn(kind)
    end = until if until is not None else (trace[-1].at if trace else 0.0) * 10 + 3600
    env.run(until=end)
    if until is None:
        # a finite stream drains: its every job is simulated to its finish. Before, the
        # run stopped at ten times the last arrival plus an hour whatever was left, and a
        # replayed burst (200 jobs stored within a second, a minute's work each) was
        # planned from the 62 that had finished by then, the other 128 left out
        while sim.jobs and env.peek() < math.inf:  # no event left: nothing will move
            env.run(until=env.now + max(end, 3600.0))
    return sim


@dataclass(frozen=True)
class SimJob:
    """One simulated job: its arrival's index in the trace (sorted by time), class,
    arrival, start and finish (None: unfinished at the end), and the wall seconds its
    CPU units and batches ran on the shared cores (the counterpart of its measured
    stage timings)."""

    index: int
    cls: PriorityClass
    arrival: float
    started: float | None
    finished: float | None
    cpu_wall: float = 0.0
    device_wall: float = 0.0


def simulate_jobs(
    trace: Sequence[Arrival],
    sampler: ServiceSampler,
    config: SimConfig,
    *,
    seed: int = 0,
    until: float | None = None,
) -> list[SimJob]:
    """Every job of ``trace`` as :func:`simulate` runs it, in arrival order: for
    comparing a replayed trace job by job (``tools/planner_oracle.py``)."""
    sim = _run(trace, sampler, config, seed, until)
    jobs = sorted([*sim.done, *sim.jobs.values()], key=lambda j: j.seq)
    return [
        SimJob(j.seq, j.cls, j.arrival, j.started, j.finished, j.cpu_wall, j.device_wall)
        for j in jobs
    ]


def simulate(
    trace: Sequence[Arrival],
    sampler: ServiceSampler,
    config: SimConfig,
    *,
    seed: int = 0,
    warmup_s: float = 0.0,
    until: float | None = None,
) -> SimResult:
    """Run ``trace`` through the policy; statistics over its ``measured`` jobs arriving
    after ``warmup_s``."""
    sim = _run(trace, sampler, config, seed, until)
    last = max((j.finished or 0.0 for j in sim.done), default=0.0)
    span = max(last, trace[-1].at if trace else 0.0, 1e-9)
    classes = {}
    for cls in PriorityClass:
        jobs = [j for j in sim.done if j.cls is cls and j.arrival >= warmup_s and j.measured]
        if not jobs:
            continue
        tat = np.array([j.finished - j.arrival for j in jobs])  # type: ignore[operator]
        wait = np.array([j.started - j.arrival for j in jobs])  # type: ignore[operator]
        late = np.array([j.finished > j.deadline for j in jobs])  # type: ignore[operator]
        classes[cls] = ClassResult(
            cls,
            len(jobs),
            float(tat.mean()),
            float(np.percentile(tat, 50)),
            float(np.percentile(tat, 95)),
            float(np.percentile(tat, 99)),
            float(wait.mean()),
            float(late.mean()),
        )
    return SimResult(
        classes,
        sim.device_busy / (span * config.devices),
        sim.cpu_busy / (span * config.cpu_workers),
        len(sim.jobs),
    )


def poisson_trace(
    rates_per_s: Mapping[PriorityClass, float], duration_s: float, seed: int
) -> list[Arrival]:
    """Independent Poisson arrivals per class over ``duration_s`` (deterministic)."""
    rng = np.random.default_rng([seed, 1])
    out: list[Arrival] = []
    for cls in PriorityClass:  # a fixed order: the same seed gives the same trace
        rate = rates_per_s.get(cls, 0.0)
        if rate <= 0:
            continue
        t = 0.0
        while True:
            t += float(rng.exponential(1.0 / rate))
            if t > duration_s:
                break
            out.append(Arrival(t, cls))
    return sorted(out, key=lambda a: a.at)


def split_batches(device_s: float, slices: int, batch_slices: int) -> tuple[float, ...]:
    """A study's device time as batches of at most ``batch_slices`` slices."""
    if device_s <= 0:
        return ()
    n = max(1, math.ceil(slices / max(1, batch_slices)))
    return (device_s / n,) * n


__all__ = [
    "Arrival",
    "ClassResult",
    "JobService",
    "ModelWork",
    "ServiceSampler",
    "SimConfig",
    "SimJob",
    "SimResult",
    "poisson_trace",
    "simulate",
    "simulate_jobs",
    "split_batches",
]
