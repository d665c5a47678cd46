"""How long a job's steps take, learned from what the scheduler measured.

Every finished job brings its stage timings (the scheduler's ``Job.timings``: ``ingest``,
``<model>: prepare|infer|merge|postprocess``, ``report``, and ``run``, its start-to-finish
wall time) and its study size (slices, voxels). Per (pipeline, step, device, precision)
the model keeps the most recent samples and fits *seconds = intercept + slope x slices*
robustly (Theil-Sen: the median of pairwise slopes, so one job slowed by a noisy
neighbour does not tilt the line). Until a key has samples spread over sizes, the bench
prior's shape is scaled to the samples it has (the median ratio measured / prior); with
no sample at all the prior itself answers. Thread-safe; updating is O(window).

A shared host's speed drifts with its load, so the window (``window`` jobs) can be short
and its samples weighted by recency (``half_life_jobs``: a sample that many jobs old
counts half; the medians become weighted medians). A job's start-to-finish time also
depends on what it runs beside: under ``urgent_exclusive`` an URGENT job runs alone,
routine jobs share the cores with up to ``max_running`` others, so a caller may name a
*lane* (e.g. the job's class) when it reports a job and when it asks for one: the
``run`` time is then also learned per lane (``run <lane>``), and a lane's estimate takes
its latency from it once the lane has samples (CPU-pool and device work stay pooled).
A caller may also report each job's *share* of the server's wall time
(:mod:`radserve.turnaround.share`), learned the same way (``share``, ``share <lane>``):
the ETA walk's throughput bound adds those up.

The steps are wall times on a shared host: under load they include waiting for a CPU
core, which is what a job will also see, so the ETA built on them is honest about it.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# the part of a job's CPU stages spent paused while URGENT work ran (inside them), as the
# scheduler records it since session 24
PAUSED = "paused"
# The step names that are not steps: waiting, the totals the scheduler adds, and the
# paused part.
_NOT_STEPS = frozenset({"queue", "total", PAUSED})
RUN = "run"  # started -> finished wall time of the whole job (``run <lane>``: per lane)
SHARE = "share"  # the job's share of the server's wall time (``share <lane>``: per lane)
DEVICE_SUFFIX = ": infer"
# a job's timings that are not work: its wait, and the totals (start to finish, arrival
# to finish) the scheduler adds beside the steps
NOT_WORK = frozenset({RUN, *_NOT_STEPS})
WINDOW = 200
MIN_SPREAD = 1.25  # largest / smallest size before a slope is fitted from data


@dataclass(frozen=True)
class StudySize:
    """What a study's service time scales with."""

    slices: int
    voxels: int | None = None

    @classmethod
    def from_shape(cls, shape: Iterable[int]) -> StudySize:
        dims = [int(d) for d in shape]
        return cls(slices=dims[0], voxels=math.prod(dims))

    @classmethod
    def from_stored_shape(cls, shape: object) -> StudySize:
        """:meth:`from_shape` of a shape read from a file (a report): ValueError unless
        it is a list of whole numbers of at least 1. Before, ``[]`` (IndexError) and
        ``[1e400, ...]`` (OverflowError) in one stored report ended ``radserve plan`` in a
        traceback, and ``[-40, ...]`` was learned as a study of -40 slices."""
        if not isinstance(shape, list) or not shape:
            raise ValueError(f"not a study's shape: {shape!r:.40}")
        try:
            size = cls.from_shape(shape)  # type: ignore[arg-type]
        except OverflowError:  # a dimension of inf
            raise ValueError("not a study's shape: a dimension is not finite") from None
        if min(int(d) for d in shape) < 1:
            raise ValueError(f"not a study's shape: {shape!r:.40}")
        return size

    @classmethod
    def of_report(cls, result_dir: Path) -> StudySize | None:
        """The size a finished job's report states (its geometry's shape), read from
        ``result_dir/report.json`` without validating the rest; None when unreadable
        (:meth:`from_stored_shape`). What the server learns from at start and
        ``radserve plan`` learns from."""
        try:
            data = json.loads((result_dir / "report.json").read_text())
            return cls.from_stored_shape(data["geometry"]["shape"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class StepKey:
    pipeline: str
    step: str
    device: str
    precision: str

    @property
    def on_device(self) -> bool:
        """Device time (the batches of a model), as opposed to CPU-pool stages."""
        return self.step.endswith(DEVICE_SUFFIX)

    def label(self) -> str:
        return f"{self.pipeline}/{self.step}@{self.device}/{self.precision}"


@dataclass(frozen=True)
class Prior:
    """Seconds = fixed + per_slice x slices for a whole job, before anything is measured.

    Defaults from the README's bench figures: the reference pipeline (organs + lesions)
    ran a 300-slice CT in 5.6 s at FP32 on this two-core host, 0.9 s of it ingest and
    report overhead (0.5 s fixed + 0.017 s per slice). ``device_share``: the part of a
    job spent in model batches (about 0.5 there: 2.8 s of 5.6 s)."""

    fixed_s: float = 0.5
    per_slice_s: float = 0.017
    device_share: float = 0.5

    def seconds(self, size: StudySize) -> float:
        return self.fixed_s + self.per_slice_s * size.slices


@dataclass(frozen=True)
class Fit:
    """One key's current line and how much to trust it."""

    intercept: float
    slope: float  # seconds per slice
    samples: int
    spread: float  # median absolute residual (seconds): the noise around the line
    source: str  # "fitted" | "scaled-prior" | "prior"

    def seconds(self, size: StudySize) -> float:
        return max(0.0, self.intercept + self.slope * size.slices)


@dataclass(frozen=True)
class JobEstimate:
    """A job's predicted service: CPU-pool and device work, its start-to-finish wall
    time (``latency``), and its share of the server's wall time (``share``: None until
    one was measured)."""

    cpu_s: float
    device_s: float
    latency_s: float
    spread_s: float
    source: str
    share_s: float | None = None

    @property
    def work_s(self) -> float:
        return self.cpu_s + self.device_s


@dataclass
class _Samples:
    x: deque[float]
    y: deque[float]
    fit: Fit | None = None

    @classmethod
    def of(cls, window: int) -> _Samples:
        return cls(deque(maxlen=window), deque(maxlen=window))


def _lane_step(lane: str, measure: str = RUN) -> str:
    return f"{measure} {lane}"


class ServiceTimeModel:
    """Per-(pipeline, step, device, precision) service-time lines, updated online."""

    def __init__(
        self, prior: Prior | None = None, *, window: int = WINDOW, half_life_jobs: float = 0.0
    ) -> None:
        if window < 1 or half_life_jobs < 0:
            raise ValueError(
                f"service-time model: window >= 1 and half_life_jobs >= 0, got {window} "
                f"and {half_life_jobs}"
            )
        self.prior = prior or Prior()
        self.window = window
        self.half_life_jobs = half_life_jobs
        self._keys: dict[StepKey, _Samples] = {}
        self._steps: dict[tuple[str, str, str], list[str]] = {}  # pipeline group -> steps
        self._sizes: deque[int] = deque(maxlen=window)
        self._lock = threading.Lock()
        # estimate() answers by (pipeline, device, precision, slices, lane), cleared when
        # the model learns: an ETA walk over 1,000 jobs asks for a handful of distinct ones
        self._memo: dict[tuple[str, str, str, int, str | None], JobEstimate] = {}

    # --- learning -----------------------------------------------------------------------
    def observe(
        self,
        *,
        pipeline: str,
        device: str,
        precision: str,
        size: StudySize,
        timings: Mapping[str, float],
        lane: str | None = None,
        share_s: float | None = None,
    ) -> None:
        """One finished job: its stage timings (seconds) and study size, and its share of
        the server's wall time when measured; with ``lane``, its ``run`` time and share
        are also learned for that lane."""
        if size.slices <= 0:
            return
        group = (pipeline, device, precision)
        timings = dict(timings)
        if share_s is not None:
            timings[SHARE] = share_s
        for measure in (RUN, SHARE):
            if lane is not None and measure in timings:
                timings[_lane_step(lane, measure)] = timings[measure]
        with self._lock:
            self._memo.clear()
            self._sizes.append(size.slices)
            steps = self._steps.setdefault(group, [])
            for name, seconds in timings.items():
                if name in _NOT_STEPS or not math.isfinite(seconds) or seconds < 0:
                    continue
                if _is_step(name) and name not in steps:
                    steps.append(name)
                key = StepKey(pipeline, name, device, precision)
                samples = self._keys.setdefault(key, _Samples.of(self.window))
                samples.x.append(float(size.slices))
                samples.y.append(float(seconds))
                samples.fit = _fit(samples, self._prior_step(key, steps), self.half_life_jobs)

    def _prior_step(self, key: StepKey, steps: list[str]) -> Fit:
        """The prior's share for one step: the whole-job line for ``run`` (and its
        lanes), else split evenly among the device steps (device_share) or the CPU
        steps (the rest)."""
        p = self.prior
        if _is_run(key.step):
            return Fit(p.fixed_s, p.per_slice_s, 0, 0.0, "prior")
        device = [s for s in steps if s.endswith(DEVICE_SUFFIX)] or [key.step]
        cpu = [s for s in steps if not s.endswith(DEVICE_SUFFIX)] or [key.step]
        if key.on_device:
            share = p.device_share / len(device)
            return Fit(0.0, p.per_slice_s * share, 0, 0.0, "prior")
        share = (1 - p.device_share) / len(cpu)
        return Fit(p.fixed_s / len(cpu), p.per_slice_s * share, 0, 0.0, "prior")

    # --- predicting ---------------------------------------------------------------------
    def typical_size(self) -> StudySize:
        """The median study seen (300 slices before any): for a study of unknown size."""
        with self._lock:
            sizes = list(self._sizes)
        return StudySize(int(np.median(sizes)) if sizes else 300)

    def sizes(self) -> list[int]:
        """The study sizes (slices) of the jobs in the window, oldest first."""
        with self._lock:
            return list(self._sizes)

    def groups(self) -> list[tuple[str, str, str]]:
        """(pipeline, device, precision) groups that have measured steps."""
        with self._lock:
            return list(self._steps)

    def step_seconds(
        self, *, pipeline: str, device: str, precision: str, size: StudySize
    ) -> dict[str, float]:
        """Each measured step's predicted seconds at ``size`` (empty: nothing measured)."""
        with self._lock:
            steps = list(self._steps.get((pipeline, device, precision), ()))
            fits = {s: self._fit_of(StepKey(pipeline, s, device, precision)) for s in steps}
        return {s: f.seconds(size) for s, f in fits.items() if f is not None}

    def estimate(
        self,
        *,
        pipeline: str,
        device: str,
        precision: str,
        size: StudySize,
        lane: str | None = None,
    ) -> JobEstimate:
        """The predicted service of one job (the prior's when nothing was measured); with
        ``lane``, its latency is the lane's ``run`` line once the lane has samples."""
        memo_key = (pipeline, device, precision, size.slices, lane)
        with self._lock:
            known = self._memo.get(memo_key)
            if known is not None:
                return known
            steps = list(self._steps.get((pipeline, device, precision), ()))
            fits = {s: self._fit_of(StepKey(pipeline, s, device, precision)) for s in steps}
            run = (
                None
                if lane is None
                else self._fit_of(StepKey(pipeline, _lane_step(lane), device, precision))
            )
            run = run or self._fit_of(StepKey(pipeline, RUN, device, precision))
            shared = (
                None
                if lane is None
                else self._fit_of(StepKey(pipeline, _lane_step(lane, SHARE), device, precision))
            )
            shared = shared or self._fit_of(StepKey(pipeline, SHARE, device, precision))
        share_s = None if shared is None else shared.seconds(size)
        if not steps:
            total = self.prior.seconds(size)
            device_s = total * self.prior.device_share
            estimate = JobEstimate(total - device_s, device_s, total, 0.0, "prior", share_s)
        else:
            cpu = sum(f.seconds(size) for s, f in fits.items() if not s.endswith(DEVICE_SUFFIX))
            dev = sum(f.seconds(size) for s, f in fits.items() if s.endswith(DEVICE_SUFFIX))
            latency = run.seconds(size) if run is not None else cpu + dev
            spread = run.spread if run is not None else 0.0
            source = run.source if run is not None else "fitted"
            estimate = JobEstimate(cpu, dev, max(latency, 1e-3), spread, source, share_s)
        with self._lock:
            if len(self._memo) < 10_000:
                self._memo[memo_key] = estimate
        return estimate

    def _fit_of(self, key: StepKey) -> Fit | None:
        samples = self._keys.get(key)
        return samples.fit if samples is not None else None

    # --- exposing -----------------------------------------------------------------------
    def describe(self) -> list[dict[str, object]]:
        """Every key's line (GET /v1/ops/service-times, ``radserve plan``)."""
        with self._lock:
            items = sorted(self._keys.items(), key=lambda kv: kv[0].label())
            out = []
            for key, samples in items:
                fit = samples.fit
                if fit is None:
                    continue
                out.append(
                    {
                        **asdict(key),
                        "on_device": key.on_device,
                        "intercept_s": round(fit.intercept, 6),
                        "seconds_per_slice": round(fit.slope, 8),
                        "samples": fit.samples,
                        "residual_s": round(fit.spread, 6),
                        "source": fit.source,
                    }
                )
        return out

    def to_json(self) -> dict[str, object]:
        """The model as data: the prior, the lines, and the raw windows (for replay)."""
        with self._lock:
            rows = [
                {**asdict(k), "slices": list(s.x), "seconds": list(s.y)}
                for k, s in self._keys.items()
            ]
            steps = [
                {"pipeline": g[0], "device": g[1], "precision": g[2], "steps": list(v)}
                for g, v in self._steps.items()
            ]
            sizes = list(self._sizes)
        return {
            "prior": asdict(self.prior),
            "lines": self.describe(),
            # per step (and ``run``) one sample per job; the lanes' runs apart (some jobs)
            "samples": [r for r in rows if not _is_lane(str(r["step"]))],
            "lane_samples": [r for r in rows if _is_lane(str(r["step"]))],
            "steps": steps,
            "sizes": sizes,
        }

    @classmethod
    def from_json(
        cls, data: Mapping[str, object], *, window: int = WINDOW, half_life_jobs: float = 0.0
    ) -> ServiceTimeModel:
        """A model rebuilt from :meth:`to_json`'s output (or a file holding it)."""
        prior = Prior(**data.get("prior", {}))  # type: ignore[arg-type]
        model = cls(prior, window=window, half_life_jobs=half_life_jobs)
        order = {
            (g["pipeline"], g["device"], g["precision"]): list(g["steps"])
            for g in data.get("steps", [])  # type: ignore[union-attr]
        }
        rows = [*data.get("samples", []), *data.get("lane_samples", [])]  # type: ignore[misc]
        for row in rows:
            key = StepKey(row["pipeline"], row["step"], row["device"], row["precision"])
            group = (key.pipeline, key.device, key.precision)
            steps = model._steps.setdefault(group, order.get(group, []))
            if not _is_run(key.step) and key.step not in steps:
                steps.append(key.step)
            samples = model._keys.setdefault(key, _Samples.of(window))
            samples.x.extend(float(v) for v in row["slices"])
            samples.y.extend(float(v) for v in row["seconds"])
            if not _is_lane(key.step):  # a lane holds some jobs only
                model._sizes.extend(int(v) for v in row["slices"][-window:])
        if "sizes" in data:  # saved since session 9: the jobs' sizes, oldest first
            model._sizes.clear()
            model._sizes.extend(int(v) for v in data["sizes"])  # type: ignore[attr-defined]
        for key, samples in model._keys.items():
            steps = model._steps[(key.pipeline, key.device, key.precision)]
            samples.fit = _fit(samples, model._prior_step(key, steps), half_life_jobs)
        return model

    @classmethod
    def load(cls, path: Path) -> ServiceTimeModel:
        return cls.from_json(json.loads(Path(path).read_text()))


def work_done(timings: Iterable[tuple[str, float]]) -> float:
    """A running job's stage seconds so far: its steps' timings (what the estimate's
    ``work_s`` sums), not its wait, totals, paused part or share."""
    return sum(v for k, v in timings if _is_step(k) and math.isfinite(v))


def _is_step(name: str) -> bool:
    """A timing of one step of the work (what the model learns a line per step for)."""
    return name not in _NOT_STEPS and not _is_run(name)


def _is_run(step: str) -> bool:
    """``run``, ``share`` or one of their lanes: a whole job's time, not a step."""
    return step in (RUN, SHARE) or _is_lane(step)


def _is_lane(step: str) -> bool:
    """``run <lane>``, ``share <lane>``: the whole-job time of one lane's jobs."""
    return step.startswith((RUN + " ", SHARE + " "))


def _fit(samples: _Samples, prior: Fit, half_life_jobs: float = 0.0) -> Fit:
    """Theil-Sen over the window (weighted by recency with a half-life: the weighted
    median of pairwise slopes, each pair weighted by the product of its samples'
    weights); the prior's shape scaled by the median ratio when the sizes are too alike
    to give a slope."""
    x = np.asarray(samples.x, dtype=float)
    y = np.asarray(samples.y, dtype=float)
    n = len(x)
    w = recency_weights(n, half_life_jobs) if half_life_jobs > 0 else None
    if n >= 3 and x.max() >= MIN_SPREAD * max(x.min(), 1.0):
        i, j = np.triu_indices(n, k=1)
        dx = x[j] - x[i]
        keep = dx != 0
        pair_slopes = (y[j] - y[i])[keep] / dx[keep]
        pair_w = None if w is None else (w[i] * w[j])[keep]
        slope = max(0.0, _median(pair_slopes, pair_w))
        intercept = _median(y - slope * x, w)
        spread = _median(np.abs(y - (intercept + slope * x)), w)
        return Fit(intercept, slope, n, spread, "fitted")
    base = prior.intercept + prior.slope * x
    ratio = _median(y / np.maximum(base, 1e-9), w)
    fitted = Fit(prior.intercept * ratio, prior.slope * ratio, n, 0.0, "scaled-prior")
    spread = _median(np.abs(y - (fitted.intercept + fitted.slope * x)), w)
    return Fit(fitted.intercept, fitted.slope, n, spread, "scaled-prior")


def _median(values: np.ndarray, weights: np.ndarray | None) -> float:
    return float(np.median(values)) if weights is None else weighted_median(values, weights)


def recency_weights(n: int, half_life: float) -> np.ndarray:
    """Weights of ``n`` samples, oldest first: 1 for the newest, halving every
    ``half_life`` samples back."""
    return np.power(0.5, np.arange(n - 1, -1, -1) / half_life)


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value where the cumulative weight reaches half the total (the ordinary
    median, the mean of the two middle values, when all weights are equal)."""
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    half = cum[-1] / 2
    low = int(np.searchsorted(cum, half, side="left"))
    if np.isclose(cum[low], half) and low + 1 < len(v):  # the halves meet between two
        return float((v[low] + v[low + 1]) / 2)
    return float(v[low])


__all__ = [
    "NOT_WORK",
    "PAUSED",
    "RUN",
    "SHARE",
    "Fit",
    "JobEstimate",
    "Prior",
    "ServiceTimeModel",
    "StepKey",
    "StudySize",
    "recency_weights",
    "weighted_median",
]
