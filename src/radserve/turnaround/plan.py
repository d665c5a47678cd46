"""Capacity planning on top of the simulation: service times from the learned model,
arrival rates from the command line (or a replayed history), the smallest number of
devices meeting per-class targets, and TAT against arrival rate as a plot.

The plot is an SVG written here (no plotting library is a dependency), or an HTML page
holding it and its figures; with matplotlib installed a ``.png`` path is drawn with it
instead. Every input is checked before anything is simulated, and a load the host cannot
serve is answered as overloaded, not simulated: its queue grows for as long as one
simulates it, so its TATs are the simulated hours, not the policy's.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.turnaround.service_time import ServiceTimeModel, StudySize
from radserve.turnaround.simulate import (
    Arrival,
    JobService,
    ServiceSampler,
    SimConfig,
    SimResult,
    poisson_trace,
    simulate,
    split_batches,
)
from radserve.turnaround.solo import SoloTimes, coarse_service
from radserve.turnaround.units import fine_service

_PER = {"s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# the number is whatever float() reads (so -1, nan and inf are named as out of range)
_RATE = re.compile(r"^\s*([^/\s]+)\s*(?:/\s*(s|min|m|h|d))?\s*$", re.IGNORECASE)
MIN_RATIOS = 10  # measured jobs before their own noise is drawn
# a job that shared the host with this many threads of others on average counts 1/e of
# one that ran alone in the noise drawn for its size (ModelSampler.size_ratios)
SHARED_THREADS = 1.0
_DURATION = re.compile(r"^\s*([0-9.]+(?:e[-+]?[0-9]+)?)\s*(s|min|m|h|d)?\s*$", re.IGNORECASE)
# arrivals one plan may simulate: at about 4 ms of CPU per job (docs/turnaround.md, cost
# of a plan) this is some 15 minutes; a longer stream says no more about the steady state
MAX_ARRIVALS = 250_000
# a device count whose busiest resource is this busy is not searched (find_devices):
# its queue settles, if at all, far above any target
SEARCH_BELOW = 0.95
# the device search stops once this many added devices in a row shortened no missed
# target's p95 TAT by this share: the TAT left is service, not waiting (plateaued)
PLATEAU_STEPS = 2
PLATEAU_GAIN = 0.02
MAX_DEVICES = 64  # the device search's largest count
MOST_DEVICES = 1_000_000  # beyond this many devices a load is not worth a count
PLOT_FORMATS = (".png", ".svg", ".html")


class PlanInputError(ValueError):
    """A rate, target, duration or file the planner cannot read; ``options``: the
    command-line options responsible, where they are not the one the value came from
    (too many arrivals: the rates, or the rates and the hours)."""

    def __init__(self, message: str, options: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.options = options


def parse_rates(text: str) -> dict[PriorityClass, float]:
    """``urgent=2/h,inpatient=10/h,outpatient=0.5/min`` -> arrivals per second. Each
    class at most once, and at least one above 0 (a plan of no arrivals says nothing)."""
    out: dict[PriorityClass, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        match = _RATE.match(value)
        try:
            number = float(match.group(1)) if match else None
        except ValueError:  # "1.2.3", "two"
            number = None
        if match is None or number is None:
            raise PlanInputError(f"rate {part!r}: expected CLASS=NUMBER/UNIT (s|min|h|d)")
        if not math.isfinite(number) or number < 0:
            raise PlanInputError(
                f"rate {part!r}: {match.group(1)} must be a finite number >= 0 (arrivals per unit)"
            )
        cls = _once(out, name, "rate")
        out[cls] = number / _PER[(match.group(2) or "h").lower()]
    if not any(rate > 0 for rate in out.values()):
        raise PlanInputError(
            f"rate {text!r}: no arrivals; give at least one class a rate above 0, "
            "e.g. urgent=2/h,outpatient=20/h"
        )
    return out


def parse_targets(text: str) -> dict[PriorityClass, float]:
    """``urgent=300s,inpatient=10min`` -> p95 TAT targets in seconds (each above 0)."""
    out: dict[PriorityClass, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        match = _DURATION.match(value)
        number = _number(match.group(1)) if match else math.nan
        # finite in seconds too: 1e308d was inf, written "Infinity" in --json (not JSON)
        seconds = number * _PER[(match.group(2) or "s").lower()] if match else math.nan
        if not match or not math.isfinite(seconds) or seconds <= 0:
            raise PlanInputError(
                f"target {part!r}: expected CLASS=NUMBER[s|min|h|d], a finite time above 0"
            )
        out[_once(out, name, "target")] = seconds
    if not out:
        raise PlanInputError(f"target {text!r}: expected e.g. urgent=300s,inpatient=10min")
    return out


def _number(text: str) -> float:
    """``text`` as a float, NaN where it is none ("1.2.3" passes the patterns)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _once(seen: Mapping[PriorityClass, float], name: str, what: str) -> PriorityClass:
    """The class ``name`` names, refused if ``seen`` has it already: two rates for one
    class are a typo, not a sum."""
    cls = _class(name)
    if cls in seen:
        raise PlanInputError(f"{what} for {cls.value} given twice")
    return cls


def _class(name: str) -> PriorityClass:
    try:
        return PriorityClass.parse(name)
    except ValueError as exc:
        raise PlanInputError(str(exc)) from None


def check_arrivals(rates_per_s: Mapping[PriorityClass, float], duration_s: float) -> None:
    """Refuse a plan whose arrivals (their expected count) exceed ``MAX_ARRIVALS``
    before drawing them: a rate typed per second instead of per hour would otherwise
    draw millions and simulate for hours. Where the rates would not fit an hour, the
    advice is their units, not fewer hours."""
    expected = sum(rates_per_s.values()) * duration_s
    if expected > MAX_ARRIVALS:
        hours = MAX_ARRIVALS / max(sum(rates_per_s.values()), 1e-12) / 3600
        if hours >= 1:
            advice, options = f"at these rates --hours {hours:.3g} or less", ("--rate", "--hours")
        else:  # the rates alone: not even an hour (--hours takes 0.01) is the fix
            fits = hours * 3600
            span = f"{fits / 60:.2g} min" if fits >= 60 else f"{max(fits, 0.01):.2g} s"
            span = "under 0.01 s" if fits < 0.01 else span
            advice = (
                f"they would fit {span}: check the rates' units (/s /min /h /d; a number "
                "alone is per hour)"
            )
            options = ("--rate",)
        raise PlanInputError(
            f"{_count(expected)} arrivals expected over {duration_s / 3600:g} h: a plan "
            f"simulates at most {MAX_ARRIVALS:,}; {advice}",
            options,
        )


def _count(n: float) -> str:
    """A count as people read it: 1,234,567, and 1e+308 rather than 309 digits."""
    if not math.isfinite(n):
        return f"more than {sys.float_info.max:.2g}"
    return f"{n:,.0f}" if n < 1e9 else f"{n:.3g}"


def plot_format(path: Path) -> str:
    """The format a ``--plot`` path asks for, checked before any simulation: its suffix
    must be one the planner writes and its folder must exist."""
    suffix = path.suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise PlanInputError(
            f"plot {str(path)!r}: the file name must end in {', '.join(PLOT_FORMATS)}"
        )
    if not path.parent.is_dir():
        raise PlanInputError(f"plot {str(path)!r}: no folder {str(path.parent)!r}")
    return suffix[1:]


def _nearest(distance: np.ndarray) -> np.ndarray:
    """Indices of the ``MIN_RATIOS`` smallest ``distance`` values and every one tied
    with the largest of them (all when there are fewer)."""
    if len(distance) <= MIN_RATIOS:
        return np.arange(len(distance))
    cut = np.partition(distance, MIN_RATIOS - 1)[MIN_RATIOS - 1]
    return np.flatnonzero(distance <= cut + 1e-12)


@dataclass(frozen=True)
class ModelSampler:
    """Job service drawn from a :class:`ServiceTimeModel`: the study size from the sizes
    seen (else the typical one), the steps' lines at that size, times a noise factor.
    Times alone (:class:`SoloTimes`) draw it from their jobs' own ratios to the lines
    (:attr:`ratios`), so the simulated work has the mean and the tail that was measured
    (the lines are medians: Theil-Sen). With ``by_size`` (the default) only the ratios
    of the jobs nearest the study's size count, weighted by how alone they ran
    (:meth:`size_ratios`): what a study's work depends on besides its slices (its
    findings make the report) travels with the study, and the lines cannot show it when
    the sizes seen are too close to fit a slope (``service_time.MIN_SPREAD``): on the
    quiet traces of 2026-12-02 the 40-slice phantom worked about 1.7 s alone and the
    47-slice one about 4.3 s, both on a 2.7-2.9 s line, so pooled ratios planned URGENT
    p50 at 2.8 s against 1.7 s measured (docs/history/turnaround.md, session 12). With
    ``per_class``, from the job's own class's ratios when that class has at least
    ``MIN_RATIOS`` jobs (:attr:`class_ratios`: not the default, it did not help on the
    traces of session 10); times as measured, or
    fewer than ``MIN_RATIOS`` jobs, lognormal noise of mean 1 with the spread the model
    measured (at least ``min_cv``): their ratios hold the contention the simulation
    adds itself."""

    model: ServiceTimeModel
    pipeline: str
    device: str
    precision: str
    batch_slices: int = 32
    min_cv: float = 0.05
    per_class: bool = False
    by_size: bool = True
    # each job as the server's units per model (radserve.turnaround.units), not one CPU
    # stage, its batches, one CPU stage
    fine: bool = False

    def __call__(self, rng: np.random.Generator, cls: PriorityClass) -> JobService:
        sizes = self.model.sizes()
        slices = int(rng.choice(sizes)) if sizes else self.model.typical_size().slices
        return self.service(rng, slices, cls)

    @cached_property
    def _measured(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slices, ratio, shared) of each job of the group in the times alone (the last
        ``model.window``): its work (the sum of its steps) over the steps' lines at its
        size, and how much it shared the host (:attr:`SoloWork.shared`); empty with
        fewer than ``MIN_RATIOS`` jobs, or times as measured. Not ``run`` (start to
        finish): it holds the job's waits for a worker, which the simulation makes
        itself."""
        group = (self.pipeline, self.device, self.precision)
        work = [w for w in getattr(self.model, "work", ()) if w.group == group]
        work = work[-self.model.window :]
        lines = np.array([sum(self._steps(w.slices).values()) for w in work])
        keep = [w for w, line in zip(work, lines, strict=True) if line > 0]
        if len(keep) < MIN_RATIOS:
            return np.array([], dtype=int), np.array([], dtype=float), np.array([])
        return (
            np.array([w.slices for w in keep], dtype=int),
            np.array([w.seconds for w in keep]) / lines[lines > 0],
            np.array([w.shared for w in keep]),
        )

    @property
    def ratios(self) -> np.ndarray:
        """Every measured job's work over the lines at its size (:attr:`_measured`)."""
        return self._measured[1]

    @cached_property
    def _by_size(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return {}

    def size_ratios(self, slices: int) -> tuple[np.ndarray, np.ndarray]:
        """The ratios a study of ``slices`` slices draws from, and their probabilities:
        the jobs nearest it in size (relative distance: at least ``MIN_RATIOS``, and
        every job as near as the farthest of them), each weighted by ``exp(-shared /
        SHARED_THREADS)``. A study of a size seen draws from the jobs of that size once
        there are ``MIN_RATIOS``. The weight is trust: a job that ran alone was
        measured, one that ran beside others is the mean-field division's estimate,
        off by up to 30 % either way on the quiet traces of 2026-12-02 (an URGENT burst
        kept some sharing, routine jobs lost too much)."""
        cached = self._by_size.get(slices)
        if cached is not None:
            return cached
        sizes, ratios, shared = self._measured
        near = _nearest(np.abs(np.log(np.maximum(sizes, 1) / max(slices, 1))))
        weights = np.exp(-shared[near] / SHARED_THREADS)
        self._by_size[slices] = (ratios[near], weights / weights.sum())
        return self._by_size[slices]

    def _noise(self, rng: np.random.Generator, slices: int) -> float:
        """A ratio drawn for a study of ``slices`` slices (times alone, measured jobs)."""
        if not self.by_size:
            return float(rng.choice(self.ratios))
        ratios, p = self.size_ratios(slices)
        return float(rng.choice(ratios, p=p))

    @cached_property
    def class_ratios(self) -> dict[PriorityClass, np.ndarray]:
        """Per class with at least ``MIN_RATIOS`` jobs of this group in the solo times:
        each job's solo work over the lines at its size."""
        if not self.per_class or not isinstance(self.model, SoloTimes):
            return {}
        group = (self.pipeline, self.device, self.precision)
        by_class: dict[PriorityClass, list[float]] = {}
        for job in self.model.work:
            line = sum(self._steps(job.slices).values()) if job.group == group else 0.0
            if line > 0:
                by_class.setdefault(job.cls, []).append(job.seconds / line)
        return {c: np.asarray(r) for c, r in by_class.items() if len(r) >= MIN_RATIOS}

    def _steps(self, slices: int) -> dict[str, float]:
        return self.model.step_seconds(
            pipeline=self.pipeline,
            device=self.device,
            precision=self.precision,
            size=StudySize(slices),
        )

    def service(
        self, rng: np.random.Generator, slices: int, cls: PriorityClass | None = None
    ) -> JobService:
        """One job of ``slices`` slices (a replayed trace knows its studies' sizes) of
        class ``cls`` (None: any class's noise)."""
        size = StudySize(slices)
        steps = self._steps(slices)
        est = self.model.estimate(
            pipeline=self.pipeline, device=self.device, precision=self.precision, size=size
        )
        own = self.class_ratios.get(cls) if cls is not None else None
        if own is not None:
            noise = float(rng.choice(own))
        elif isinstance(self.model, SoloTimes) and len(self.ratios):
            noise = self._noise(rng, slices)
        else:
            cv = max(self.min_cv, 1.4826 * est.spread_s / max(est.latency_s, 1e-9))
            noise = float(rng.lognormal(-cv * cv / 2, cv))
        if not steps:  # the prior only: its device share, ingest a third of the CPU work
            return JobService(
                est.cpu_s / 3 * noise,
                split_batches(est.device_s * noise, slices, self.batch_slices),
                est.cpu_s * 2 / 3 * noise,
            )
        if self.fine:
            return fine_service(steps, slices, self.batch_slices, noise)
        return coarse_service(steps, slices, self.batch_slices, noise)


@dataclass(frozen=True)
class Plan:
    """One simulated configuration and whether it meets the targets."""

    devices: int
    result: SimResult
    meets: bool | None  # None without targets
    max_running: int | None = None  # the routine jobs at once it simulated (all devices)

    def as_dict(self) -> dict[str, object]:
        return {
            "devices": self.devices,
            "max_running": self.max_running,
            "meets_targets": self.meets,
            **self.result.as_dict(),
        }


def meets(result: SimResult, targets: Mapping[PriorityClass, float]) -> bool:
    """Every targeted class's p95 TAT within its target (a class with no jobs passes)."""
    for cls, target in targets.items():
        got = result.classes.get(cls)
        if got is not None and got.tat_p95_s > target:
            return False
    return True


def run_plan(
    trace: Sequence[Arrival],
    sampler: ServiceSampler,
    *,
    devices: int,
    cpu_workers: int,
    scheduler: SchedulerSettings,
    seed: int,
    warmup_s: float,
    targets: Mapping[PriorityClass, float] | None = None,
    cores_per_device: int | None = None,
) -> Plan:
    config = _config(devices, cpu_workers, scheduler, cores_per_device)
    result = simulate(trace, sampler, config, seed=seed, warmup_s=warmup_s)
    return Plan(
        devices,
        result,
        meets(result, targets) if targets else None,
        config.scheduler.max_running,
    )


def _config(
    devices: int, cpu_workers: int, scheduler: SchedulerSettings, cores_per_device: int | None
) -> SimConfig:
    """The simulated host; ``cores_per_device``: each device is a CPU host of that many
    cores, shared by its batches and its CPU stages (None: separate hardware).
    ``scheduler.max_running`` is per device, as the CPU workers are: N devices run N
    times its routine jobs at once (a site adding devices raises it; kept at one
    device's, more devices gave the same TATs, a probe's 4 and 8 devices 73.1 / 133.1 s
    p50 / p95 alike, and --find-devices answered that no count works)."""
    cores = None if cores_per_device is None else cores_per_device * devices
    running = scheduler.max_running * max(1, devices)
    scaled = scheduler.model_copy(update={"max_running": running})
    return SimConfig(devices, cpu_workers, scaled, host_cores=cores)


@dataclass(frozen=True)
class OfferedLoad:
    """Busy seconds per second the arrivals bring: the device's batches and the CPU
    stages, each as the sampler times them."""

    device: float
    cpu: float

    def utilisation(
        self, devices: int, cpu_workers_per_device: int, cores_per_device: int | None
    ) -> float:
        """The busiest resource's share of its capacity on ``devices`` devices (1: it is
        busy all the time and the queue grows without bound). On separate hardware the
        devices and the CPU workers each carry their own part; on a CPU device
        (``cores_per_device``) a batch runs on all of a device's cores and a CPU stage on
        one, so the cores carry both, as the simulation shares them (before session 31
        the search compared each with its own capacity there, and a CPU host busy 140 %
        was planned as one device that kept up: its queue grew for the whole plan)."""
        n = max(1, devices)
        workers = self.cpu / (max(1, cpu_workers_per_device) * n)
        if cores_per_device is None:
            return max(self.device / n, workers)
        cores = max(1, cores_per_device)
        return max((self.device * cores + self.cpu) / (cores * n), workers)

    def fewest_devices(
        self,
        cpu_workers_per_device: int,
        cores_per_device: int | None,
        below: float = SEARCH_BELOW,
        most: int = MOST_DEVICES,
    ) -> int | None:
        """The fewest devices whose :meth:`utilisation` is under ``below``; None when more
        than ``most`` would be needed (service times set absurdly high, say)."""
        n = 1
        while self.utilisation(n, cpu_workers_per_device, cores_per_device) >= below:
            if n > most:
                return None
            n *= 2
        low = n // 2 + 1 if n > 1 else 1
        while low < n:  # the utilisation falls as the devices grow: bisect
            mid = (low + n) // 2
            if self.utilisation(mid, cpu_workers_per_device, cores_per_device) >= below:
                low = mid + 1
            else:
                n = mid
        return n if n <= most else None

    def as_dict(self) -> dict[str, float]:
        return {"device_s_per_s": round(self.device, 4), "cpu_s_per_s": round(self.cpu, 4)}


def offered_load(
    trace: Sequence[Arrival], sampler: ServiceSampler, seed: int, samples: int = 500
) -> OfferedLoad:
    """The load the trace brings (:class:`OfferedLoad`), from up to ``samples`` of its
    jobs: a host it keeps busier than it can be is overloaded and need not be
    simulated."""
    if len(trace) < 2:  # one arrival measures no rate
        return OfferedLoad(0.0, 0.0)
    span = max(trace[-1].at - trace[0].at, 1.0)
    rng = np.random.default_rng([seed, 7])
    picks = rng.choice(len(trace), size=min(samples, len(trace)), replace=False)
    device = cpu = 0.0
    for i in picks:
        job = sampler(rng, trace[int(i)].cls)
        device += sum(job.batches_s)
        cpu += job.cpu_pre_s + job.cpu_post_s
    per_job = len(trace) / span / len(picks)
    return OfferedLoad(device * per_job, cpu * per_job)


def find_devices(
    trace: Sequence[Arrival],
    sampler: ServiceSampler,
    *,
    targets: Mapping[PriorityClass, float],
    cpu_workers_per_device: int,
    scheduler: SchedulerSettings,
    seed: int,
    warmup_s: float,
    max_devices: int = MAX_DEVICES,
    cores_per_device: int | None = None,
    finite: bool = False,
) -> tuple[Plan | None, list[Plan], int]:
    """The smallest device count (1..max_devices) whose simulation meets ``targets``;
    CPU workers grow with the devices (``cpu_workers_per_device`` each). Counts whose
    busiest resource the trace keeps ``SEARCH_BELOW`` (95 %) busy or more are not
    simulated (the queue would only grow); the third value is the first count
    simulated. The search ends without an answer when more devices stop shortening the
    missed targets' TATs (:func:`plateaued`). ``finite``: a replay of the store's
    history, which ends and drains: every count is simulated from one (its load over its
    own span is no steady rate: a probe's two jobs a second apart made 1-4 devices
    "overloaded" and the answer 5)."""
    load = offered_load(trace, sampler, seed)
    fewest = 1 if finite else load.fewest_devices(cpu_workers_per_device, cores_per_device)
    first = fewest if fewest is not None else MOST_DEVICES + 1
    tried: list[Plan] = []
    for n in range(first, max_devices + 1):
        plan = run_plan(
            trace,
            sampler,
            devices=n,
            cpu_workers=cpu_workers_per_device * n,
            scheduler=scheduler,
            seed=seed,
            warmup_s=warmup_s,
            targets=targets,
            cores_per_device=cores_per_device,
        )
        tried.append(plan)
        if plan.meets:
            return plan, tried, first
        if plateaued(tried, targets):
            break
    return None, tried, first


def plateaued(
    tried: Sequence[Plan],
    targets: Mapping[PriorityClass, float],
    steps: int = PLATEAU_STEPS,
    gain: float = PLATEAU_GAIN,
) -> bool:
    """The last ``steps`` device counts added shortened no missed target's p95 TAT by
    ``gain`` (relative) or more: the class's TAT is its service time, not its wait, and
    more devices will not meet the target (an URGENT target under one study's own time
    used to simulate all 64 counts: over ten minutes for a day at 220 an hour)."""
    if len(tried) <= steps:
        return False
    for before, after in zip(tried[-steps - 1 : -1], tried[-steps:], strict=True):
        for cls, target in targets.items():
            old, new = before.result.classes.get(cls), after.result.classes.get(cls)
            if old is None or new is None or new.tat_p95_s <= target:
                continue
            if old.tat_p95_s - new.tat_p95_s >= gain * old.tat_p95_s:
                return False
    return True


@dataclass(frozen=True)
class Curve:
    """p50 / p95 TAT per class at each arrival-rate scale."""

    scales: tuple[float, ...]
    p50: dict[PriorityClass, list[float]]
    p95: dict[PriorityClass, list[float]]
    # the scales whose arrivals keep the host busier than it can be: not simulated (NaN)
    overloaded: tuple[float, ...] = ()


def tat_curve(
    rates: Mapping[PriorityClass, float],
    sampler: ServiceSampler,
    *,
    devices: int,
    cpu_workers: int,
    scheduler: SchedulerSettings,
    duration_s: float,
    seed: int,
    scales: Sequence[float] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0),
    cores_per_device: int | None = None,
) -> Curve:
    """p50 / p95 TAT per class at each multiple of ``rates``; a multiple whose arrivals
    keep the host busy all the time is not simulated (its queue grows with the
    simulated hours, so no TAT settles; NaN, listed in :attr:`Curve.overloaded`)."""
    p50: dict[PriorityClass, list[float]] = {c: [] for c in rates}
    p95: dict[PriorityClass, list[float]] = {c: [] for c in rates}
    overloaded: list[float] = []
    workers = max(1, cpu_workers // max(1, devices))
    # the busiest multiple's stream is held to MAX_ARRIVALS: shorter at high rates
    busiest = max(scales, default=1.0) * sum(rates.values())
    duration_s = min(duration_s, MAX_ARRIVALS / busiest) if busiest > 0 else duration_s
    for scale in scales:
        scaled = {c: r * scale for c, r in rates.items()}
        trace = poisson_trace(scaled, duration_s, seed)
        load = offered_load(trace, sampler, seed)
        result = None
        if load.utilisation(devices, workers, cores_per_device) < 1.0:
            config = _config(devices, cpu_workers, scheduler, cores_per_device)
            result = simulate(trace, sampler, config, seed=seed + 1)
        else:
            overloaded.append(scale)
        for cls in rates:
            got = result.classes.get(cls) if result is not None else None
            p50[cls].append(got.tat_p50_s if got else math.nan)
            p95[cls].append(got.tat_p95_s if got else math.nan)
    return Curve(tuple(scales), p50, p95, tuple(overloaded))


_COLOURS = {
    PriorityClass.URGENT: "#c0392b",
    PriorityClass.INPATIENT: "#d68910",
    PriorityClass.OUTPATIENT: "#2471a3",
}


def write_plot(curve: Curve, rates: Mapping[PriorityClass, float], path: Path) -> Path:
    """TAT vs total arrival rate at ``path`` (:func:`plot_format`): PNG drawn by
    matplotlib when installed (else an SVG beside it, its suffix changed), SVG, or an
    HTML page holding the SVG and the figures as a table. Returns the file written."""
    path = Path(path)
    total_h = sum(rates.values()) * 3600
    xs = [s * total_h for s in curve.scales]
    kind = plot_format(path)
    if kind == "png":
        try:
            import matplotlib  # type: ignore[import-not-found]

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # type: ignore[import-not-found]
        except ImportError:
            path = path.with_suffix(".svg")
        else:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for cls in curve.p95:
                ax.plot(xs, curve.p95[cls], "-o", color=_COLOURS[cls], label=f"{cls.value} p95")
                ax.plot(xs, curve.p50[cls], "--", color=_COLOURS[cls], label=f"{cls.value} p50")
            if curve.overloaded:
                ax.axvspan(min(curve.overloaded) * total_h, max(xs), color="0.9", zorder=0)
                ax.set_title(_overload_note(curve, total_h), fontsize=9)
            ax.set_xlabel("arrivals per hour (all classes)")
            ax.set_ylabel("turnaround (s)")
            ax.set_yscale("log")
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(path, dpi=120)
            plt.close(fig)
            return path
    if kind == "html":
        path.write_text(_html(curve, xs, total_h))
    else:
        path.write_text(_svg(curve, xs, total_h))
    return path


def _overload_note(curve: Curve, total_h: float) -> str:
    return (
        f"overloaded from {min(curve.overloaded) * total_h:.3g} arrivals/h: "
        "the queue grows without bound (not simulated)"
    )


def _html(curve: Curve, xs: list[float], total_h: float) -> str:
    """A page for a browser: the plot, and per arrival rate each class's p50 / p95."""
    head = "".join(
        f"<th>{escape(c.value)} p50 s</th><th>{escape(c.value)} p95 s</th>" for c in curve.p95
    )
    rows = []
    for i, x in enumerate(xs):
        over = curve.scales[i] in curve.overloaded
        cells = "".join(
            f"<td>{_cell(curve.p50[c][i], over)}</td><td>{_cell(curve.p95[c][i], over)}</td>"
            for c in curve.p95
        )
        rows.append(f"<tr><td>{x:.3g}</td>{cells}</tr>")
    return "\n".join(
        [
            '<!doctype html><html lang="en"><head><meta charset="utf-8">',
            "<title>radserve plan: turnaround against arrival rate</title>",
            "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
            "</style></head><body>",
            "<h1>Turnaround against arrival rate</h1>",
            _svg(curve, xs, total_h),
            f"<table><thead><tr><th>arrivals/h</th>{head}</tr></thead>",
            f"<tbody>{''.join(rows)}</tbody></table>",
            "<p>Not simulated: overloaded.</p>" if curve.overloaded else "",
            "<p>No arrivals: the class had no job at that rate (its stream drew none).</p>"
            if _no_arrivals(curve)
            else "",
            "</body></html>",
        ]
    )


def _cell(value: float, overloaded: bool) -> str:
    """A TAT in the table; NaN is either an overloaded rate (not simulated) or a class
    with no job at that rate (simulated: before, both said "overloaded")."""
    if math.isnan(value):
        return "overloaded" if overloaded else "no arrivals"
    return f"{value:.1f}"


def _no_arrivals(curve: Curve) -> bool:
    """A simulated rate at which some class had no job (its TATs NaN)."""
    return any(
        math.isnan(v)
        for i, scale in enumerate(curve.scales)
        if scale not in curve.overloaded
        for vs in curve.p95.values()
        for v in vs[i : i + 1]
    )


def _svg(curve: Curve, xs: list[float], total_h: float) -> str:
    width, height, left, bottom, top, right = 720, 440, 70, 50, 20, 160
    values = [v for d in (curve.p50, curve.p95) for vs in d.values() for v in vs if v > 0]
    lo = math.log10(min(values)) if values else 0.0
    hi = math.log10(max(values)) if values else 1.0
    if hi - lo < 1e-6:
        hi = lo + 1
    x0, x1 = min(xs), max(xs)

    def px(x: float) -> float:
        return left + (x - x0) / max(x1 - x0, 1e-9) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (math.log10(y) - lo) / (hi - lo) * (height - top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
        f'y2="{height - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
        f'<text x="{(width - right + left) / 2}" y="{height - 12}" text-anchor="middle">'
        "arrivals per hour (all classes)</text>",
        f'<text x="16" y="{(height - bottom + top) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(height - bottom + top) / 2})">turnaround (s, log)</text>',
    ]
    for x in xs:
        parts.append(
            f'<text x="{px(x):.1f}" y="{height - bottom + 16}" text-anchor="middle">{x:.3g}</text>'
        )
    for exp in range(math.floor(lo), math.ceil(hi) + 1):
        y = py(10.0**exp)
        if top - 1 <= y <= height - bottom + 1:
            parts.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{10.0**exp:g}</text>'
            )
    row = 0
    for cls in curve.p95:
        colour = _COLOURS[cls]
        for label, series, dash in (("p95", curve.p95[cls], ""), ("p50", curve.p50[cls], "5,4")):
            points = " ".join(
                f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, series, strict=True) if v > 0
            )
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                f'stroke-dasharray="{dash}" points="{points}"/>'
            )
            ly = top + 14 + 18 * row
            parts.append(
                f'<line x1="{width - right + 10}" y1="{ly - 4}" x2="{width - right + 36}" '
                f'y2="{ly - 4}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>'
            )
            parts.append(
                f'<text x="{width - right + 42}" y="{ly}">{escape(cls.value)} {label}</text>'
            )
            row += 1
    if curve.overloaded:
        x = px(min(curve.overloaded) * total_h)
        parts.append(
            f'<rect x="{x:.1f}" y="{top}" width="{width - right - x:.1f}" '
            f'height="{height - top - bottom}" fill="#888" fill-opacity="0.15"/>'
        )
        parts.append(
            f'<text x="{left + 4}" y="{top + 2}">{escape(_overload_note(curve, total_h))}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


__all__ = [
    "MAX_ARRIVALS",
    "MAX_DEVICES",
    "PLOT_FORMATS",
    "Curve",
    "ModelSampler",
    "OfferedLoad",
    "Plan",
    "PlanInputError",
    "check_arrivals",
    "find_devices",
    "meets",
    "offered_load",
    "parse_rates",
    "parse_targets",
    "plateaued",
    "plot_format",
    "run_plan",
    "tat_curve",
    "write_plot",
]
