"""A host speed factor from the finished jobs' service times (session 18, replay only).

A host running slower than its service-time model (drift, other load) makes every job
ahead take longer; this learns how much from the last finished jobs' service time over
the one predicted at their start, and scales the estimates by it. Used by the replay
(:class:`radserve.turnaround.replay.Variant` ``speed``), not by the server: on the kept
traces it did not lower the median error (docs/history/turnaround.md, session 18).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radserve.turnaround.bias import BiasCorrection
from radserve.turnaround.eta import URGENT, Capacity, Entry
from radserve.turnaround.service_time import NOT_WORK, JobEstimate


@dataclass(frozen=True)
class Speed:
    """A host speed factor (session 18): the last ``window`` finished jobs' actual
    service time over the one their estimate predicted when they started (``measure``:
    ``run``, start to finish, against the latency; ``stages``, the stage timings summed,
    against the CPU and device seconds), the median log-ratio shrunk toward 1 by
    ``n / (n + prior_jobs)`` and bounded (:class:`BiasCorrection`'s rule), one factor
    for the host (``per: all``), per latency lane (``lane``: URGENT alone, routine
    shared), or one learned from the URGENT jobs alone for every job (``alone``: under
    ``urgent_exclusive`` they run without other work started beside them). It scales
    the estimates of the queued and running jobs (``scope: work``), or also those of
    the expected arrivals (``all``). Service times only, not turnarounds."""

    window: int = 5
    prior_jobs: float = 3.0
    per: str = "all"
    scope: str = "work"
    measure: str = "run"


class HostSpeed:
    """The estimates scaled by the host's recent speed (:class:`Speed`): each succeeded
    job teaches its recorded service time over the one estimated at the first walk that
    saw it running (the model's prediction of that run)."""

    def __init__(self, speed: Speed) -> None:
        self.speed = speed
        self.bias = BiasCorrection(window=speed.window, prior_jobs=speed.prior_jobs, by="all")
        self.predicted: dict[str, tuple[int, float]] = {}  # job -> (key, latency at start)

    def _key(self, cls: int) -> int:
        return int(cls == URGENT) if self.speed.per == "lane" else 0

    def scaled(self, entries: list[Entry], capacity: Capacity) -> tuple[list[Entry], Capacity]:
        for e in entries:
            if e.running and (self.speed.per != "alone" or e.cls == URGENT):
                est = e.estimate
                predicted = (
                    est.latency_s if self.speed.measure == "run" else est.cpu_s + est.device_s
                )
                self.predicted.setdefault(e.job_id, (self._key(e.cls), predicted))
        entries = [dataclasses.replace(e, estimate=self._times(e.cls, e.estimate)) for e in entries]
        if self.speed.scope == "all":
            arrivals = tuple(
                dataclasses.replace(a, estimate=self._times(a.cls, a.estimate))
                for a in capacity.arrivals
            )
            capacity = dataclasses.replace(capacity, arrivals=arrivals)
        return entries, capacity

    def _times(self, cls: int, estimate: JobEstimate) -> JobEstimate:
        factor = self.bias.factor(self._key(cls))
        if factor == 1.0:
            return estimate
        share = None if estimate.share_s is None else factor * estimate.share_s
        return dataclasses.replace(
            estimate,
            cpu_s=factor * estimate.cpu_s,
            device_s=factor * estimate.device_s,
            latency_s=factor * estimate.latency_s,
            spread_s=factor * estimate.spread_s,
            share_s=share,
        )

    def finished(self, end: Mapping[str, Any]) -> None:
        predicted = self.predicted.pop(str(end["job"]), None)
        timings = end.get("timings") or {}
        actual = timings.get("run")
        if self.speed.measure == "stages":
            actual = sum(v for k, v in timings.items() if k not in NOT_WORK) or None
        if predicted is not None and end["state"] == "succeeded" and actual is not None:
            self.bias.observe(predicted[0], predicted[1], float(actual))


__all__ = ["HostSpeed", "Speed"]
