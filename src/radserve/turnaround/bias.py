"""Online correction of ETAs by their measured bias, per priority class.

The walk (:mod:`radserve.turnaround.eta`) is a model: service times measured alone,
arrivals at average rates, aging not anticipated. Whatever it leaves out shows up as a
*signed* error that is steady for a class on a given host and load (e.g. routine jobs
overtaken more than expected). So every finished job teaches its class the ratio
``actual / predicted`` of its time to finish, as predicted when it was first walked
(at submission); new ETAs scale their time to finish by the class's factor.

The factor is the median of the last ``window`` log-ratios (robust: one job stuck
behind an unusual burst does not swing it), shrunk toward 1 by ``n / (n + prior_jobs)``
so that it starts neutral and moves as evidence comes, and kept within ``bounds``.
Pure: no clock, no threads (the server holds it under its own lock).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

_MIN_PREDICTED_S = 1.0  # a prediction of under a second teaches nothing about the ratio


@dataclass
class BiasCorrection:
    """Per class rank: a factor for the predicted time to finish, learned online."""

    window: int = 20
    prior_jobs: float = 3.0
    bounds: tuple[float, float] = (0.5, 3.0)
    _logs: dict[int, deque[float]] = field(default_factory=dict)

    def observe(self, cls: int, predicted_s: float, actual_s: float) -> None:
        """A finished job of class ``cls``: predicted and actual seconds from its first
        ETA to its finish."""
        if self.window <= 0 or predicted_s < _MIN_PREDICTED_S or actual_s <= 0:
            return
        logs = self._logs.setdefault(cls, deque(maxlen=self.window))
        logs.append(math.log(actual_s / predicted_s))

    def factor(self, cls: int) -> float:
        """The class's factor (1.0 until a job of it has finished)."""
        logs = self._logs.get(cls)
        if not logs:
            return 1.0
        n = len(logs)
        shrunk = statistics.median(logs) * n / (n + self.prior_jobs)
        low, high = self.bounds
        return min(high, max(low, math.exp(shrunk)))

    def correct(self, cls: int, now: float, finish: float) -> float:
        """``finish`` with its time from ``now`` scaled by the class's factor."""
        return now + self.factor(cls) * max(0.0, finish - now)

    def describe(self) -> dict[int, dict[str, float | int]]:
        """Per class rank seen: jobs learned from and the factor now."""
        return {
            cls: {"jobs": len(logs), "factor": round(self.factor(cls), 4)}
            for cls, logs in sorted(self._logs.items())
        }


__all__ = ["BiasCorrection"]
