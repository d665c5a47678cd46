"""Online correction of ETAs by their measured bias: a multiplicative calibration.

The walk (:mod:`radserve.turnaround.eta`) is a model: service times measured alone,
arrivals at average rates, aging not anticipated. Whatever it leaves out shows up as a
*signed* error that may be steady on a given host and load (e.g. routine jobs overtaken
more than expected). So every finished job teaches the ratio ``actual / predicted`` of
its time to finish, as predicted at a reading (:meth:`BiasCorrection.reading`), and new
ETAs scale their time to finish by the factor of their key. It learns only when a job
finishes (:meth:`BiasCorrection.finished`): no look-ahead.

- *key* (``by``): one factor per class (``class``, the server's since 2026-12-01), per
  queue-depth band at the reading (``depth``: 0, 1-2, 3-6, 7+ jobs ahead), per class and
  depth band (``class-depth``), per band of the predicted time to finish (``horizon``:
  under 10 s, 10-30 s, 30-90 s, longer), or one for every job (``all``);
- *readings learned from* (``learn``): the job's first reading (``first``: at
  submission), or its first reading under each key it passed through (``every``: a job
  queued deep, then shallow teaches both bands; session 16);
- *statistic*: the median of the last ``window`` log-ratios (robust: one job stuck
  behind an unusual burst does not swing it) or their mean (``mean``), shrunk toward 1
  by ``n / (n + prior_jobs)`` so that it starts neutral and moves as evidence comes,
  1 until ``min_jobs`` have finished, and kept within ``bounds``.

Pure: no clock, no threads (the server holds it under its own lock).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

KEYS = ("class", "depth", "class-depth", "horizon", "all")
LEARN = ("first", "every")
STATISTICS = ("median", "mean")
_MIN_PREDICTED_S = 1.0  # a prediction of under a second teaches nothing about the ratio
_DEPTHS = ((0, "0"), (2, "1-2"), (6, "3-6"), (None, "7+"))  # (last position, label)
_HORIZONS = ((10.0, "<10s"), (30.0, "10-30s"), (90.0, "30-90s"), (None, "90s+"))


def depth_band(position: int) -> int:
    """Queue-depth band of a job with ``position`` jobs ranked ahead: 0, 1-2, 3-6, 7+."""
    return next(i for i, (last, _) in enumerate(_DEPTHS) if last is None or position <= last)


def horizon_band(seconds: float) -> int:
    """Band of a predicted time to finish: under 10 s, 10-30 s, 30-90 s, longer."""
    return next(i for i, (top, _) in enumerate(_HORIZONS) if top is None or seconds < top)


@dataclass
class BiasCorrection:
    """Factors for the predicted time to finish, learned online from finished jobs."""

    window: int = 20
    prior_jobs: float = 3.0
    bounds: tuple[float, float] = (0.5, 3.0)
    by: str = "class"
    learn: str = "first"
    statistic: str = "median"
    min_jobs: int = 1
    _logs: dict[int, deque[float]] = field(default_factory=dict, init=False)
    # job -> key -> (read at, raw predicted finish): what it teaches when it finishes
    _pending: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("by", self.by, KEYS),
            ("learn", self.learn, LEARN),
            ("statistic", self.statistic, STATISTICS),
        ):
            if value not in allowed:
                raise ValueError(f"unknown bias {name} {value!r}; expected one of {allowed}")

    def key(self, cls: int, position: int, horizon_s: float) -> int:
        """The key of a reading: a job of class rank ``cls`` with ``position`` jobs
        ranked ahead, predicted to finish ``horizon_s`` from now (before correction)."""
        if self.by == "class":
            return cls
        if self.by == "depth":
            return depth_band(position)
        if self.by == "class-depth":
            return cls * 10 + depth_band(position)
        if self.by == "horizon":
            return horizon_band(horizon_s)
        return 0

    def label(self, key: int) -> str:
        """A key as :meth:`describe` names it."""
        if self.by == "class":
            return f"class {key}"
        if self.by == "depth":
            return f"depth {_DEPTHS[key][1]}"
        if self.by == "class-depth":
            return f"class {key // 10}, depth {_DEPTHS[key % 10][1]}"
        if self.by == "horizon":
            return f"horizon {_HORIZONS[key][1]}"
        return "all"

    def reading(self, job_id: str, key: int, now: float, finish: float) -> None:
        """A job's raw (uncorrected) predicted ``finish`` read at ``now`` under ``key``:
        kept to learn from when it finishes (its first, or its first under each key)."""
        if self.window <= 0:
            return
        kept = self._pending.setdefault(job_id, {})
        if self.learn == "every" or not kept:
            kept.setdefault(key, (now, finish))

    def finished(self, job_id: str, at: float, succeeded: bool) -> None:
        """A job ended at ``at``: a succeeded one teaches every reading kept for it."""
        kept = self._pending.pop(job_id, {})
        if succeeded:
            for key, (read_at, finish) in kept.items():
                self.observe(key, finish - read_at, at - read_at)

    def observe(self, key: int, predicted_s: float, actual_s: float) -> None:
        """A finished job under ``key``: predicted and actual seconds from a reading to
        its finish."""
        if self.window <= 0 or predicted_s < _MIN_PREDICTED_S or actual_s <= 0:
            return
        logs = self._logs.setdefault(key, deque(maxlen=self.window))
        logs.append(math.log(actual_s / predicted_s))

    def factor(self, key: int) -> float:
        """The key's factor (1.0 until ``min_jobs`` of it have finished)."""
        logs = self._logs.get(key)
        if not logs or len(logs) < self.min_jobs:
            return 1.0
        n = len(logs)
        centre = statistics.median(logs) if self.statistic == "median" else statistics.fmean(logs)
        low, high = self.bounds
        return min(high, max(low, math.exp(centre * n / (n + self.prior_jobs))))

    def correct(self, key: int, now: float, finish: float) -> float:
        """``finish`` with its time from ``now`` scaled by the key's factor."""
        return now + self.factor(key) * max(0.0, finish - now)

    def describe(self) -> dict[str, dict[str, float | int]]:
        """Per key seen: jobs learned from and the factor now."""
        return {
            self.label(key): {"jobs": len(logs), "factor": round(self.factor(key), 4)}
            for key, logs in sorted(self._logs.items())
        }


__all__ = ["KEYS", "LEARN", "STATISTICS", "BiasCorrection", "depth_band", "horizon_band"]
