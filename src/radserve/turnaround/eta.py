"""Predicted start and finish of every unfinished job: one walk of the queue order.

The scheduler hands out work to the best-ranked job first (class after aging, then
earliest deadline), so a job's finish depends on the work ranked ahead of it. The walk
visits jobs in that order once and keeps three running figures:

- *throughput*: a job cannot finish before the work ranked ahead of it has been done.
  Once the server has measured jobs' *shares* of its wall time
  (:mod:`radserve.turnaround.share`: wall time split among the jobs running together),
  the bound is ``now`` plus the shares of every job so far: what the server really
  spent per job at the concurrency it runs (session 10: stage timings summed counted
  the sharing twice, ETAs late; times measured alone, early). A running job counts the
  part of its estimated share it has not had yet (``share_left: measured``, session
  11: by its latency left, a latency learned alone made a job 3 s into a 10 s run look
  done). Optionally (``running_behind``, off by default) a queued job also counts the
  shares left of the running jobs ranked *behind* it: a routine job is not preempted,
  so an OUTPATIENT job already running takes its share of the wall time an INPATIENT
  job queued ahead of it waits through (quiet host, session 11: 4-10 s of a 7-17 s
  turnaround), but the shares learned are high on a loaded host and it did not help
  there. Before that, CPU-pool seconds and device seconds spread over the CPU workers
  and the devices (``now + max(cpu / workers, device / devices)``); when the "device"
  is the host's own cores (``host_cores``: the CPU or OpenVINO-on-CPU provider, which
  uses every core for a batch), device and CPU-pool work take turns on the same cores,
  so the bound is their sum (``cpu / min(workers, cores) + device / devices``), not the
  larger;
- *latency*: a job takes at least its own start-to-finish time (``run``), once started;
- *slots*: a routine job starts when one of ``max_running`` routine slots frees (a heap
  of the slots' free times); URGENT starts at once, and with ``urgent_exclusive`` no
  routine job starts before the last URGENT job ahead has finished.

That is O(n log max_running) for n jobs. The walk itself assumes no new arrivals. Later
arrivals of every class that ranks ahead of a job overtake it at batch boundaries (URGENT
ahead of all routine work, INPATIENT ahead of OUTPATIENT), so a job's *finish* adds the
work those classes are expected to bring, at their observed arrival rates, within its
horizon (:func:`overtaking_delay`: the Poisson mean; measured through a real server,
leaving out every arrival made routine ETAs ~70 % early, and allowing for URGENT ones
only left jobs queued behind >= 3 others 38 % early on a 32-study trace:
docs/history/turnaround.md), and
the *pessimistic* finish the 90th percentile of that work plus the noise of the job's
own service time. Aging bounds the window: a routine job aged one class up is overtaken
by arrivals of that class only while their deadlines come before its own (EDF), and by a
lower class no more.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from radserve.domain.priority import PriorityClass
from radserve.turnaround.service_time import JobEstimate

URGENT = 0  # PriorityClass.URGENT.rank (the walk needs only the order of classes)
LANES = ("none", "class", "exclusive")
SHARE_LEFT = ("measured", "latency", "progress")
_Z90 = 1.2816  # standard normal 90th percentile
_MAD_SIGMA = 1.4826  # median absolute deviation -> standard deviation (normal noise)


@dataclass(frozen=True)
class Entry:
    """One unfinished job as the walk sees it, in queue (rank) order."""

    job_id: str
    cls: int  # PriorityClass.rank, 0 = URGENT
    running: bool
    deadline: float
    started: float | None
    estimate: JobEstimate
    # a running job's share of the server's wall time so far (ShareMeter.so_far)
    share_so_far: float | None = None
    # a running job's stage seconds so far (its work done: service_time.work_done)
    worked_s: float | None = None


@dataclass(frozen=True)
class Arrivals:
    """Later arrivals of one class as the walk expects them: a rate and the work each
    brings (the typical study's estimate)."""

    cls: int  # PriorityClass.rank
    rate_per_s: float
    estimate: JobEstimate
    # the rate's Gamma posterior shape (arrivals counted + prior, ArrivalRates.posterior):
    # how sure it is; None: a point rate
    shape: float | None = None


@dataclass(frozen=True)
class Capacity:
    """What serves the queue, the policy's aging, and how often each class arrives."""

    cpu_workers: int = 2
    devices: int = 1
    max_running: int = 4
    urgent_exclusive: bool = True
    arrivals: tuple[Arrivals, ...] = ()
    # the scheduler's aging: TAT per class rank, and the share of it left when aged
    tat_s: tuple[float, ...] = ()
    aging_fraction: float = 0.25
    # the device's work runs on the host's cores (a CPU device): how many there are
    host_cores: int | None = None
    # wall seconds the server has measured it takes per second of this model's work
    # while saturated (radserve.turnaround.drain: a shared host drains its queue slower
    # than the per-job times imply; 1.0: the model as it is)
    drain: float = 1.0
    # a running job's share left (session 11): its estimated share less the share it has
    # had so far (``measured``), or the share in proportion to its latency left
    # (``latency``, before: a latency learned at a cold start or at another concurrency
    # made running jobs look done), or (``progress``, session 30) in proportion to the
    # work it has left: its stage seconds so far against its estimated work. A routine
    # job running beside better-ranked work is charged an equal split of the wall time
    # while its units wait, so by ``measured`` a starved job looks done
    share_left: str = "measured"
    # a queued job's throughput bound also counts the shares left of the running jobs
    # ranked behind it: they go on running, only URGENT work holds them (session 11: not
    # the default; on four traces it helped on one, tied on one, worse on two: README,
    # Turnaround)
    running_behind: bool = False
    # seconds of wall time each later arrival ranked with or behind a routine job takes
    # beside it once it runs (radserve.turnaround.share.BesideMeter, session 14; 0: none
    # allowed, as before)
    beside_s: float = 0.0
    # the allowance at the counted rates as points (``point``), or its median under the
    # rates' Gamma posteriors (``posterior``: the compound Poisson delay's variance grows
    # by the rate's own, each class's r^2 w^2 hold^2 / shape, and the delay is taken as a
    # Gamma of that mean and variance; session 15, not the default; ``mean``: that
    # variance, taken as a normal, its mean lengthened by E[r^2] = r^2 (1 + 1/shape) over
    # the window each class's own delay adds, tools/eta_replay.py's POSTERIOR_MEAN)
    rate_posterior: str = "point"
    # the band's service-time noise: the job's own spread (``own``), or also the spreads
    # of the jobs ranked ahead, as independent noises of the work they take (``ahead``,
    # session 18: the sum of their shares varies with each of them)
    band: str = "own"
    # the band's late end as the time to finish scaled by this ratio (at least 1): the
    # conformal band's learned quantile (radserve.turnaround.conformal, turnaround.band:
    # conformal); None: the walk's own band above
    late_ratio: float | None = None
    # the overtaking allowance on a routine job's latency chain: added to whichever of
    # its chain and its throughput bound is later (``always``, before session 32), or,
    # when its chain starts at once, to the throughput bound only (``waiting``): the run
    # time learned from finished jobs already holds the URGENT holds and the sharing
    # that jobs of its kind met, so adding it again made the ETAs of jobs that start at
    # once late (replayed on the 34 kept traces: jobs with none ahead +30.5 -> +24.2 %,
    # 1-2 ahead +16.8 -> +7.0 %, OUTPATIENT ones 163 -> 63 % median error at once;
    # behind >= 3 23.1 -> 22.4 %, halfway unchanged: docs/history/turnaround.md)
    chain_allowance: str = "waiting"
    # a running job's throughput bound counts the queued jobs ranked ahead of it but for
    # those that can only start in the slot it holds, directly or after another queued
    # job in it (``other_slots``, session 36), or every one (``all``, before): such a job
    # never shares the server with it (a probe at max_running 1: a running OUTPATIENT
    # job behind two queued INPATIENT ones was predicted 35 s late, finished in 0.6 s,
    # and raised a false deadline-risk alert). Those starting in another running job's
    # slot stay counted: that slot's predicted end is itself a prediction (excluding every
    # queued job predicted to start after it ends made halfway ETAs earlier on the 34
    # kept traces, 17.4 -> 17.7 %, on runs whose running jobs were already early)
    queued_ahead: str = "other_slots"

    def work_s(self, cpu_s: float, device_s: float) -> float:
        """Seconds this capacity needs for ``cpu_s`` of CPU-pool and ``device_s`` of
        device work, done in parallel as far as the hardware allows, at the measured
        drain rate."""
        return self.drain * self.model_work_s(cpu_s, device_s)

    def model_work_s(self, cpu_s: float, device_s: float) -> float:
        """:meth:`work_s` by the service-time model alone (no measured drain)."""
        workers, devices = max(1, self.cpu_workers), max(1, self.devices)
        if self.host_cores is None:
            return max(cpu_s / workers, device_s / devices)
        return cpu_s / max(1, min(workers, self.host_cores)) + device_s / devices

    def hold_s(self, cls: int, estimate: JobEstimate) -> float:
        """Seconds one arriving job of class ``cls`` holds back the work it overtakes:
        an URGENT job under ``urgent_exclusive`` stops every other start until it ends
        (its latency), any other job takes its share of the throughput."""
        if cls == URGENT and self.urgent_exclusive:
            return estimate.latency_s
        return self.through_s(estimate)

    def through_s(self, estimate: JobEstimate, fraction: float = 1.0) -> float:
        """Seconds of the server's wall time ``fraction`` of one job takes: its measured
        share when there is one, else its work spread over this capacity."""
        if estimate.share_s is not None:
            return self.drain * estimate.share_s * fraction
        return self.work_s(estimate.cpu_s * fraction, estimate.device_s * fraction)


def latency_lane(cls: int, lanes: str, urgent_exclusive: bool = True) -> str | None:
    """The service-time lane (:meth:`ServiceTimeModel.estimate`) of a job of class rank
    ``cls``: ``none``, one latency for every job; ``class``, one per class (its name);
    ``exclusive``, ``alone`` for URGENT under ``urgent_exclusive`` (it runs alone) and
    ``shared`` for the rest (they share the cores with up to ``max_running`` jobs)."""
    if lanes == "none":
        return None
    if lanes == "class":
        return next(c for c in PriorityClass if c.rank == cls).value.lower()
    if lanes == "exclusive":
        return "alone" if cls == URGENT and urgent_exclusive else "shared"
    raise ValueError(f"unknown service-time lanes {lanes!r}; expected one of {', '.join(LANES)}")


def on_host_cores(device: str) -> bool:
    """The device name (``RuntimeChoice.device``) runs its batches on the host's CPU
    cores (cpu, openvino), not on an accelerator (cuda:N)."""
    return not device.startswith("cuda")


@dataclass(frozen=True)
class Eta:
    """One job's prediction (scheduler clock seconds). ``finish`` is the walk's
    (optimistic) finish; ``finish_late`` the pessimistic one."""

    job_id: str
    position: int  # in the queue order, 0 = first (= jobs ranked ahead of it)
    start: float
    finish: float
    finish_late: float
    deadline: float

    def slack(self, margin_s: float = 0.0) -> float:
        """Seconds the predicted finish leaves before ``deadline - margin_s``."""
        return self.deadline - margin_s - self.finish


def walk(entries: Sequence[Entry], now: float, capacity: Capacity) -> list[Eta]:
    """Every entry's predicted start and finish; ``entries`` in the scheduler's order."""
    # routine slots as (free by the latency chain alone, free at the predicted finish):
    # chaining predicted finishes plus full latencies would count contention twice
    # and the running job whose slot it is ("": a free one), whoever queued holds it next
    slots: list[tuple[float, float, str]] = []
    for e in entries:  # slots held by routine jobs already started
        if e.running and e.cls != URGENT:
            free = now + _remaining(e, now)
            slots.append((free, free, e.job_id))
    slots += [(now, now, "")] * max(0, capacity.max_running - len(slots))
    heapq.heapify(slots)
    cpu = device = shared = 0.0  # work ranked so far: unmeasured (cpu, device), shares
    # the work (cpu, device, share) of the queued jobs ranked so far, summed by the
    # running job whose slot they wait for
    waiting_on: dict[str, tuple[float, float, float]] = {}
    noise_ahead = 0.0  # the noise (s) of the work ranked so far (band: ahead)
    behind = _running_behind(entries, now, capacity)
    urgent_until = now
    out: list[Eta] = []
    for position, e in enumerate(entries):
        est = e.estimate
        fraction = 1.0
        if e.running:
            left = _remaining(e, now)
            fraction = left / max(est.latency_s, 1e-9)
            start = e.started if e.started is not None else now
            own = now + left
        else:
            start = own_start = now
        if est.share_s is not None:
            taken = _share_left(e, now, capacity, fraction)
            shared += taken
            parts = (0.0, 0.0, taken)
        else:
            cpu += est.cpu_s * fraction
            device += est.device_s * fraction
            taken = est.latency_s * fraction  # its work, for the band (band: ahead)
            parts = (est.cpu_s * fraction, est.device_s * fraction, 0.0)
        holder = ""
        if not e.running:
            if e.cls != URGENT:
                if slots:
                    chain, free, holder = heapq.heappop(slots)
                    own_start, start = max(now, chain), max(now, free)
                if capacity.urgent_exclusive:
                    own_start, start = max(own_start, urgent_until), max(start, urgent_until)
            own = own_start + est.latency_s
        beside = 0.0
        if not e.running and (e.cls != URGENT or not capacity.urgent_exclusive):
            beside = behind[position + 1]  # running jobs ranked behind it go on
        if e.running and capacity.queued_ahead == "other_slots":
            # the queued jobs ahead that wait for its own slot take nothing from it
            idle = waiting_on.get(e.job_id, (0.0, 0.0, 0.0))
            throughput = now + capacity.work_s(cpu - idle[0], device - idle[1])
            throughput += shared - idle[2]
        else:
            throughput = now + capacity.work_s(cpu, device) + shared + beside
        if not e.running:
            summed = waiting_on.get(holder, (0.0, 0.0, 0.0))
            waiting_on[holder] = (summed[0] + parts[0], summed[1] + parts[1], summed[2] + parts[2])
        walked = max(own, throughput)
        if e.cls == URGENT:
            urgent_until = max(urgent_until, walked)
        elif not e.running:
            heapq.heappush(slots, (own, walked, holder))
        noise = _Z90 * _MAD_SIGMA * math.hypot(est.spread_s, noise_ahead)
        if capacity.band == "ahead":  # its own share's noise for the jobs behind it
            noise_ahead = math.hypot(noise_ahead, est.spread_s * taken / max(est.latency_s, 1e-9))
        finish, late = walked, walked + noise
        if e.cls != URGENT and capacity.arrivals:  # the chain stays arrival-free
            run = _remaining(e, now) if e.running else est.latency_s
            extra = beside_delay(e.cls, run, capacity)
            mean, high = overtaking_delay(e, walked + extra - now, now, capacity)
            if capacity.chain_allowance == "waiting" and not e.running and own_start <= now:
                finish = max(own, throughput + extra + mean)
                late = max(own, throughput + extra + high) + noise
            else:
                finish, late = finish + extra + mean, late + extra + high
        if capacity.late_ratio is not None:
            late = now + max(capacity.late_ratio, 1.0) * (finish - now)
        out.append(Eta(e.job_id, position, start, finish, late, e.deadline))
    return out


def _share_left(e: Entry, now: float, capacity: Capacity, fraction: float) -> float:
    """Seconds of the server's wall time a job with a measured share still takes: all
    of it while queued; once running, the part of its work not done yet (``share_left:
    progress``, at least 5 % of it), its estimate less what it has had so far
    (``measured``, at least 5 % of it) or ``fraction`` of it (its latency left over its
    latency)."""
    est = e.estimate
    if e.running and capacity.share_left == "progress" and e.worked_s is not None:
        done = min(e.worked_s / max(est.work_s, 1e-9), 0.95)
        return capacity.through_s(est, 1.0 - done)
    if e.running and capacity.share_left in ("measured", "progress") and e.share_so_far is not None:
        share = est.share_s or 0.0
        return capacity.drain * max(share - e.share_so_far, 0.05 * share)
    return capacity.through_s(est, fraction)


def _running_behind(entries: Sequence[Entry], now: float, capacity: Capacity) -> list[float]:
    """For each position, the shares left of the running jobs ranked at or after it
    (one more entry: 0), when ``capacity.running_behind``; else zeros."""
    out = [0.0] * (len(entries) + 1)
    if not capacity.running_behind:
        return out
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        left = 0.0
        if e.running and e.estimate.share_s is not None:
            fraction = _remaining(e, now) / max(e.estimate.latency_s, 1e-9)
            left = _share_left(e, now, capacity, fraction)
        out[i] = out[i + 1] + left
    return out


def _remaining(e: Entry, now: float) -> float:
    """A started job's remaining time: its latency less the time it has run, at least
    5 % of the latency (a job past its prediction is not about to be done)."""
    latency = e.estimate.latency_s
    ran = now - (e.started if e.started is not None else now)
    return max(latency - ran, 0.05 * latency)


def beside_delay(cls: int, run_s: float, capacity: Capacity) -> float:
    """Expected seconds the later arrivals ranked with or behind a routine job of class
    rank ``cls`` add to its finish by running beside it: those that arrive during its
    run (``run_s``) at their classes' rates, each taking ``capacity.beside_s`` of the
    wall time (the arrivals' own share is theirs, but the server's wall time is split)."""
    if capacity.beside_s <= 0:
        return 0.0
    rate = sum(a.rate_per_s for a in capacity.arrivals if a.cls >= cls)
    return rate * run_s * capacity.beside_s


def overtaking_delay(
    entry: Entry, horizon: float, now: float, capacity: Capacity
) -> tuple[float, float]:
    """(expected, 90th percentile) seconds that later arrivals of classes ranked ahead
    of ``entry`` add to its finish, ``horizon`` seconds out from ``now``.

    Each class ``k`` ahead arrives as a Poisson stream (rate ``r_k``) and each arrival
    holds the job back ``hold_k`` seconds (:meth:`Capacity.hold_s`), so the delay is a
    compound Poisson sum: mean ``sum r_k w_k hold_k``, variance ``sum r_k w_k hold_k^2``
    over each class's overtaking window ``w_k`` (:func:`overtaking_window`); the 90th percentile
    is the normal approximation. The delay lengthens the horizon, so it is applied twice
    (one fixed-point step).

    Later arrivals cannot take more than the whole server while they overtake: where the
    classes ahead would bring more work per second than a second (``sum r_k hold_k > 1``)
    their rates are scaled down to exactly that. Without the bound a slow study just after
    a start, when each class's rate is still its prior pseudo-arrival over seconds, was
    given hours of allowance (a 60 s OUTPATIENT study alone on an idle server: 2 h, and a
    deadline-risk alert); on the 34 kept traces it changes one loaded run, for the better.
    """

    posterior = capacity.rate_posterior == "posterior"
    mean_of = capacity.rate_posterior == "mean"
    # the work per second the classes ahead bring, at most the server's second
    load = sum(
        a.rate_per_s * capacity.hold_s(a.cls, a.estimate)
        for a in capacity.arrivals
        if a.cls < entry.cls and a.rate_per_s > 0
    )
    scale = 1.0 / load if load > 1.0 else 1.0

    def delay(z: float) -> float:
        total = 0.0
        first: dict[int, tuple[float, float]] = {}  # class: (window, delay) of step one
        for _ in range(2):
            mean = var = 0.0
            for a in capacity.arrivals:
                if a.cls >= entry.cls or a.rate_per_s <= 0:
                    continue
                window = overtaking_window(entry, a.cls, horizon + total, now, capacity)
                rate = scale * a.rate_per_s
                n = rate * window
                hold = capacity.hold_s(a.cls, a.estimate)
                mean += n * hold
                var += n * hold * hold
                if (posterior or mean_of) and a.shape:
                    var += (n * hold) ** 2 / a.shape
                if mean_of and a.shape and a.cls in first and total > 0:
                    # E[r^2] = r^2 (1 + 1/shape): the class's own step-one delay
                    # lengthened its window by as much as the rate
                    w1, d1 = first[a.cls]
                    mean += rate * hold * d1 / a.shape * (window - w1) / total
                first[a.cls] = (window, n * hold)
            total = _gamma_quantile(mean, var, z) if posterior else mean + z * math.sqrt(var)
        return total

    return delay(0.0), delay(_Z90)


def _gamma_quantile(mean: float, var: float, z: float) -> float:
    """The quantile at standard normal ``z`` of a Gamma of this mean and variance
    (Wilson-Hilferty), 0 for no delay."""
    if mean <= 0 or var <= 0:
        return max(mean, 0.0)
    c = var / (9.0 * mean * mean)  # 1 / (9 x shape)
    return mean * max(0.0, 1.0 - c + z * math.sqrt(c)) ** 3


def overtaking_window(
    entry: Entry, ahead: int, horizon: float, now: float, capacity: Capacity
) -> float:
    """Seconds from ``now`` during which an arrival of class rank ``ahead`` still ranks
    before ``entry``: its whole horizon for URGENT; for a routine class, until the job
    is aged one class up (``deadline - aging_fraction x TAT``), and if that lifts it to
    the arriving class, as long as the arrival's own deadline comes first (EDF)."""
    horizon = max(horizon, 0.0)
    if ahead == URGENT or entry.cls >= len(capacity.tat_s):
        return horizon
    until = entry.deadline - capacity.aging_fraction * capacity.tat_s[entry.cls]
    if ahead == entry.cls - 1:
        until = max(until, entry.deadline - capacity.tat_s[ahead])
    return min(horizon, max(0.0, until - now))


__all__ = [
    "LANES",
    "SHARE_LEFT",
    "Arrivals",
    "Capacity",
    "Entry",
    "Eta",
    "beside_delay",
    "latency_lane",
    "on_host_cores",
    "overtaking_delay",
    "overtaking_window",
    "walk",
]
