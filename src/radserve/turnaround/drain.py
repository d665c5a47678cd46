"""How fast the server really drains its queue, measured: wall seconds per second of
the service-time model's work while it is saturated.

The ETA walk's throughput bound (:meth:`radserve.turnaround.eta.Capacity.work_s`) adds
up the model's per-job times and spreads them over the workers and cores. On a host
shared with other processes (or whose cores the stages share unevenly) the queue drains
slower, or faster, than that: measured through a real server on a loaded 2-core host,
jobs queued behind >= 3 others finished 2-5x later than the walk said
(docs/history/turnaround.md).
So the server measures it: while a job is *waiting* (the server is saturated: every slot
it may use is busy), each completion adds (wall seconds since the previous completion or
since saturation began, the model's work seconds of the completed job as the walk
counts it); the factor is the sum of the first over the sum of the second over the last
``window`` completions, kept within ``bounds``, and 1.0 (the model) until ``min_jobs``
completions were seen saturated. Pure: no clock, no threads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class DrainMeter:
    window: int = 20
    min_jobs: int = 3
    bounds: tuple[float, float] = (0.5, 5.0)
    _samples: deque[tuple[float, float]] = field(default_factory=deque)
    _mark: float | None = None  # start of the saturated stretch not yet counted

    def saturation(self, at: float, saturated: bool) -> None:
        """The queue's state at ``at``: a job waiting (saturated) or not."""
        if not saturated:
            self._mark = None
        elif self._mark is None:
            self._mark = at

    def completed(self, at: float, work_s: float, saturated: bool) -> None:
        """A job finished at ``at`` with ``work_s`` of model work (the walk's measure);
        ``saturated``: a job was still waiting when it did."""
        if self.window <= 0:
            return
        if self._mark is not None and work_s > 0 and at > self._mark:
            self._samples.append((at - self._mark, work_s))
            while len(self._samples) > self.window:
                self._samples.popleft()
        self._mark = at if saturated else None

    def factor(self) -> float:
        if len(self._samples) < self.min_jobs:
            return 1.0
        wall = sum(s[0] for s in self._samples)
        work = sum(s[1] for s in self._samples)
        low, high = self.bounds
        return min(high, max(low, wall / work))

    def describe(self) -> dict[str, float | int]:
        return {"jobs": len(self._samples), "factor": round(self.factor(), 4)}


__all__ = ["DrainMeter"]
