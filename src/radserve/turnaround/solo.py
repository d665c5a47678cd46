"""Service times alone, learned from jobs that ran together on a host's shared cores.

A finished job's stage timings are wall times: on a CPU device, whose batches run on
every core, they include the slowdown from the other jobs' units running at the same
time, and a routine stage's time includes its pauses while URGENT work ran
(``scheduler.yield_to_urgent``). The planner's host model (:mod:`.simulate`, processor-
shared cores) applies that sharing itself, so fed those times it counts the sharing
twice. :func:`solo_timings` divides it out, per job, from what the store keeps of every
job (arrival, start, finish, class, stage timings):

- the job's *active* time is its run (start to finish) less, for a routine job, the
  time URGENT work was unfinished (waiting or running: the routine job was held then),
  and the CPU stage time it spent paused is taken off: as the scheduler measured it (the
  job's ``paused`` timing, recorded since session 24), else as the share of that held
  time its CPU stages covered on average;
- every job demands ``demand = (cores x device s + CPU s) / active s`` threads on average
  while active (a batch runs on every core, a CPU stage on one);
- a job's stages ran at ``1 / slowdown`` of their solo speed, with ``slowdown =
  max(1, (own threads + the others' mean demand over its active time) / cores)``: own
  threads 1 for CPU stages, ``cores`` for batches.

This is a mean-field estimate (each job's demand spread evenly over its active time), not
an exact reconstruction of which stage overlapped which; it counts only radserve's own
jobs (other processes on the host are not seen). It divides out more than the planner's
simulation puts back (session 15: the batches' simulated walls 9-19 % short on all ten
kept traces, routine jobs' runs 13-35 % short), so :func:`consistent_timings` takes it
as a start only: every recorded job is simulated on the host (:mod:`.simulate`) with its
solo work, and each job's CPU and batch work rescaled until the simulated wall seconds
of its units are its measured ones (a fixed point of the simulation's own sharing,
URGENT pauses included; no fitted constant).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from radserve.domain.priority import PriorityClass
from radserve.turnaround.service_time import (
    DEVICE_SUFFIX,
    NOT_WORK,
    PAUSED,
    RUN,
    Prior,
    ServiceTimeModel,
    StudySize,
)
from radserve.turnaround.simulate import (
    Arrival,
    JobService,
    SimConfig,
    SimJob,
    simulate_jobs,
    split_batches,
)

URGENT = PriorityClass.URGENT


@dataclass(frozen=True)
class JobRun:
    """One finished job: when it arrived, started and finished (seconds, one clock), its
    class, study size and stage timings (``Job.timings``)."""

    cls: PriorityClass
    arrival: float
    started: float
    finished: float
    slices: int
    timings: Mapping[str, float]
    pipeline: str = ""  # "": the one solo_model is given
    precision: str = ""

    @property
    def device_s(self) -> float:
        return sum(v for k, v in self.timings.items() if k.endswith(DEVICE_SUFFIX))

    @property
    def cpu_s(self) -> float:
        return sum(
            v
            for k, v in self.timings.items()
            if k not in NOT_WORK and not k.endswith(DEVICE_SUFFIX)
        )


@dataclass(frozen=True)
class SoloWork:
    """One job's work alone (the sum of its solo stage times), with what it was."""

    cls: PriorityClass
    group: tuple[str, str, str]  # (pipeline, device, precision)
    slices: int
    seconds: float
    # the other jobs' mean thread demand while it ran (:attr:`Slowdown.others`): 0, it
    # ran alone and ``seconds`` is what was measured; the more, the more of ``seconds``
    # is the mean-field division's guess
    shared: float = 0.0


class SoloTimes(ServiceTimeModel):
    """Service times with the sharing they ran under divided out. What is left around
    their lines is the work's own spread (and what the division misses), which the
    planner draws its noise from (:class:`radserve.turnaround.plan.ModelSampler`), per
    class (:attr:`work`): URGENT jobs run alone under ``urgent_exclusive`` and the
    division leaves more of the sharing in the routine jobs' times than processor
    sharing accounts for (quiet host, session 9: URGENT p50 1.4 s measured, 2.4 s
    planned from the pooled lines); times as measured hold the contention the
    simulation adds itself."""

    def __init__(self, prior: Prior | None = None) -> None:
        super().__init__(prior)
        self.work: list[SoloWork] = []


@dataclass(frozen=True)
class Slowdown:
    """How much slower than alone one job's stages ran, and the CPU seconds it spent
    paused for URGENT work."""

    cpu: float
    device: float
    paused_cpu_s: float
    others: float = 0.0  # the other jobs' mean thread demand while it was active


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(i for i in intervals if i[1] > i[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _overlap(lo: float, hi: float, spans: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in spans)


def slowdowns(
    runs: Sequence[JobRun],
    cores: int,
    *,
    urgent_holds: bool = True,
    max_threads: int | None = None,
) -> list[Slowdown]:
    """Each run's :class:`Slowdown` on a host of ``cores`` shared by CPU stages (one
    thread) and device batches (every core). ``urgent_holds``: routine work made no
    progress while URGENT work was unfinished (``urgent_exclusive`` /
    ``yield_to_urgent``, the defaults). ``max_threads``: at most this many threads run
    at once (the server's CPU workers, its URGENT lane and a batch's threads), however
    many jobs are started (URGENT jobs all start at once)."""
    if cores < 1:
        raise ValueError("cores must be >= 1")
    held = _union((r.arrival, r.finished) for r in runs if r.cls is URGENT) if urgent_holds else []
    n = len(runs)
    bounds = np.unique(
        np.array(
            [t for r in runs for t in (r.started, r.finished)] + [t for s in held for t in s],
            dtype=float,
        )
    )
    if n == 0 or len(bounds) < 2:
        return [Slowdown(1.0, 1.0, 0.0) for _ in runs]
    lo, hi = bounds[:-1], bounds[1:]
    mid, length = (lo + hi) / 2, hi - lo
    in_held = np.zeros(len(mid), dtype=bool)
    for a, b in held:
        in_held |= (mid > a) & (mid < b)
    # active[j, s]: job j ran in segment s and was not held there
    active = np.zeros((n, len(mid)), dtype=bool)
    demand = np.zeros(n)
    paused = np.zeros(n)
    for j, r in enumerate(runs):
        inside = (mid > r.started) & (mid < r.finished)
        active[j] = inside & ~in_held if r.cls is not URGENT else inside
        run = max(r.finished - r.started, 1e-9)
        was_held = float(length[inside & ~active[j]].sum())
        measured = r.timings.get(PAUSED)  # recorded by the scheduler since session 24
        estimate = was_held * min(1.0, r.cpu_s / run) if measured is None else measured
        paused[j] = min(r.cpu_s, estimate)
        busy = max(float(length[active[j]].sum()), 1e-9)
        demand[j] = (cores * r.device_s + r.cpu_s - paused[j]) / busy
    load = demand @ active  # threads demanded in each segment, all jobs
    if max_threads is not None:
        load = np.minimum(load, max_threads)
    out = []
    for j in range(n):
        seg = active[j]
        busy = float(length[seg].sum())
        others = float(((load[seg] - demand[j]) * length[seg]).sum()) / busy if busy > 0 else 0.0
        others = max(0.0, others)
        cpu_others = device_others = others
        if max_threads is not None:  # the unit's own threads are among the cap's
            cpu_others = min(others, max_threads - 1)
            device_others = min(others, max(0, max_threads - cores))
        out.append(
            Slowdown(
                max(1.0, (1 + cpu_others) / cores),
                max(1.0, (cores + device_others) / cores),
                float(paused[j]),
                others,
            )
        )
    return out


def solo_timings(run: JobRun, slowdown: Slowdown) -> dict[str, float]:
    """``run``'s stage timings alone: CPU stages less their paused time (spread over
    them by size) and divided by the CPU slowdown, batches by the device slowdown;
    ``run`` (start to finish) becomes their sum."""
    cpu = run.cpu_s
    keep = max(0.0, cpu - slowdown.paused_cpu_s) / cpu if cpu > 0 else 1.0
    out: dict[str, float] = {}
    for name, seconds in run.timings.items():
        if name in NOT_WORK:
            continue
        if name.endswith(DEVICE_SUFFIX):
            out[name] = seconds / slowdown.device
        else:
            out[name] = seconds * keep / slowdown.cpu
    out[RUN] = sum(out.values())
    return out


# rounds of :func:`consistent_timings`, each step the square root of the walls' ratio (a
# full step overshoots: more work, more sharing); 8 brings the ten kept traces' batch
# walls within 2 % and CPU walls within 7 % of the measured
CONSISTENT_ROUNDS = 8


def coarse_service(
    timings: Mapping[str, float], slices: int, batch_slices: int, scale: float = 1.0
) -> JobService:
    """The planner's default job of these timings (a job's solo ones, or the steps the
    service-time model predicts), each times ``scale``: ingest, the batches, the rest."""
    device = sum(v for k, v in timings.items() if k.endswith(DEVICE_SUFFIX))
    rest = sum(v for k, v in timings.items() if k not in NOT_WORK and k != "ingest") - device
    return JobService(
        timings.get("ingest", 0.0) * scale,
        split_batches(device * scale, slices, batch_slices),
        max(0.0, rest) * scale,
    )


def consistent_timings(
    runs: Sequence[JobRun],
    timings: Sequence[Mapping[str, float]],
    host: SimConfig,
    *,
    rounds: int = CONSISTENT_ROUNDS,
) -> list[dict[str, float]]:
    """``timings`` (each run's solo timings, e.g. :func:`solo_timings`) made consistent
    with ``host``'s sharing: all ``runs`` simulated from their arrivals with that work
    (coarse jobs, the scheduler's batches), then each run's CPU steps times (measured /
    simulated CPU wall)^0.5 and its batches times (measured / simulated batch wall)^0.5,
    ``rounds`` times. The simulation adds the other jobs' sharing and the URGENT pauses
    back itself, so what it is fed is what the job did alone by its own account."""
    out = [dict(t) for t in timings]
    if not runs:
        return out
    zero = min(r.arrival for r in runs)
    batch = host.scheduler.max_batch_size

    def no_draw(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        raise AssertionError("every run brings its work")

    # simulate_jobs gives the jobs in arrival order (a stable sort: ties keep order)
    order = sorted(range(len(runs)), key=lambda j: runs[j].arrival)
    for _ in range(rounds):
        trace = [
            Arrival(r.arrival - zero, r.cls, coarse_service(t, r.slices, batch))
            for r, t in zip(runs, out, strict=True)
        ]
        for j, sim in zip(order, simulate_jobs(trace, no_draw, host), strict=True):
            out[j] = rescaled(out[j], runs[j], sim)
    return out


def rescaled(
    timings: Mapping[str, float], run: JobRun, sim: SimJob, step: float = 0.5
) -> dict[str, float]:
    """One round of :func:`consistent_timings` for one job: ``timings`` (its solo ones)
    with the CPU steps times (``run``'s measured CPU seconds / ``sim``'s simulated CPU
    wall)^``step`` and the batches the same with the device's."""
    cpu = (run.cpu_s / sim.cpu_wall) ** step if sim.cpu_wall > 0 else 1.0
    device = (run.device_s / sim.device_wall) ** step if sim.device_wall > 0 else 1.0
    out = {
        k: v * (device if k.endswith(DEVICE_SUFFIX) else cpu)
        for k, v in timings.items()
        if k not in NOT_WORK
    }
    out[RUN] = sum(out.values())
    return out


@dataclass(frozen=True)
class Division:
    """Runs with the sharing they ran under divided out by the mean field: each run's
    :class:`Slowdown` and solo timings (:func:`solo_timings`). What both the plain and
    the consistent solo models start from (:func:`model_of`), computed once."""

    runs: Sequence[JobRun]
    slowdowns: list[Slowdown]
    timings: list[dict[str, float]]


def divide(
    runs: Sequence[JobRun],
    cores: int,
    *,
    urgent_holds: bool = True,
    max_threads: int | None = None,
) -> Division:
    """The :class:`Division` of ``runs`` (every job that ran on the host, oldest first)
    on ``cores`` (see :func:`slowdowns`)."""
    factors = slowdowns(runs, cores, urgent_holds=urgent_holds, max_threads=max_threads)
    solo = [solo_timings(run, slow) for run, slow in zip(runs, factors, strict=True)]
    return Division(runs, factors, solo)


def model_of(
    division: Division,
    *,
    prior: Prior | None = None,
    pipeline: str,
    device: str,
    precision: str,
    host: SimConfig | None = None,
) -> SoloTimes:
    """The solo timings of ``division`` (a run's own pipeline and precision, else these)
    as a model. ``host``: made consistent with that simulated host
    (:func:`consistent_timings`); None: the mean field alone."""
    runs = division.runs
    solo = list(division.timings)
    if host is not None:
        kept = [j for j, r in enumerate(runs) if r.timings]
        fixed = consistent_timings([runs[j] for j in kept], [solo[j] for j in kept], host)
        for j, timings in zip(kept, fixed, strict=True):
            solo[j] = timings
    model = SoloTimes(prior)
    for run, slow, timings in zip(runs, division.slowdowns, solo, strict=True):
        if run.slices > 0 and run.timings:
            group = (run.pipeline or pipeline, device, run.precision or precision)
            model.observe(
                pipeline=group[0],
                device=device,
                precision=group[2],
                size=StudySize(run.slices),
                timings=timings,
            )
            work = sum(v for k, v in timings.items() if k != RUN)
            model.work.append(SoloWork(run.cls, group, run.slices, work, slow.others))
    return model


def solo_model(
    runs: Sequence[JobRun],
    cores: int,
    *,
    prior: Prior | None = None,
    pipeline: str,
    device: str,
    precision: str,
    urgent_holds: bool = True,
    max_threads: int | None = None,
    host: SimConfig | None = None,
) -> SoloTimes:
    """The solo timings of ``runs`` (every job that ran on the host, oldest first) as a
    model: :func:`model_of` their :func:`divide`."""
    division = divide(runs, cores, urgent_holds=urgent_holds, max_threads=max_threads)
    return model_of(
        division, prior=prior, pipeline=pipeline, device=device, precision=precision, host=host
    )


def runs_from_end_records(records: Iterable[Mapping[str, object]]) -> list[JobRun]:
    """The succeeded jobs of a recorded run (``radserve bench --scenario eta --json``:
    ``eta_records``; end records with timings and slices, classes from the walks), in
    order of finish."""
    classes: dict[str, PriorityClass] = {}
    by_rank = {c.rank: c for c in PriorityClass}
    ends = []
    for rec in records:
        if rec.get("kind") == "walk":
            for entry in rec["entries"]:  # type: ignore[attr-defined]
                classes.setdefault(str(entry[0]), by_rank[int(entry[1])])
        elif rec.get("kind") == "end" and rec.get("state") == "succeeded" and "timings" in rec:
            ends.append(rec)
    out = []
    for rec in sorted(ends, key=lambda r: float(r["at"])):  # type: ignore[arg-type]
        timings = {str(k): float(v) for k, v in rec["timings"].items()}  # type: ignore[attr-defined]
        cls = classes.get(str(rec["job"]))
        if cls is None or RUN not in timings or "total" not in timings:
            continue
        at = float(rec["at"])  # type: ignore[arg-type]
        slices = int(rec["slices"])  # type: ignore[call-overload]
        out.append(JobRun(cls, at - timings["total"], at - timings[RUN], at, slices, timings))
    return out


__all__ = [
    "CONSISTENT_ROUNDS",
    "Division",
    "JobRun",
    "Slowdown",
    "SoloTimes",
    "SoloWork",
    "coarse_service",
    "consistent_timings",
    "divide",
    "model_of",
    "rescaled",
    "runs_from_end_records",
    "slowdowns",
    "solo_model",
    "solo_timings",
]
