"""Each priority class's arrival rate, for the ETA walk's allowance for later arrivals
that overtake a job (:func:`radserve.turnaround.eta.overtaking_delay`).

Arrivals are counted per class over the last ``window_s`` (an hour). While the server
has seen less than that, the span is the time since the *first arrival* it saw (at least
``min_span_s``), not since it started: until session 11 the span was the time since the
server started, at least 60 s, so the first minutes after a start (a restart, a warm-up)
counted arrivals over time in which none could come, and a class not seen yet counted as
never coming. On the quiet traces of session 11 that made the routine ETAs of jobs queued
behind >= 3 others early: the INPATIENT and URGENT jobs that overtook them arrived 3-7x
faster than the rates the server had counted (README, Turnaround). Each class also gets
``prior_arrivals`` pseudo-arrivals over the span (a class not seen yet may still come;
after an hour one pseudo-arrival is one an hour, next to nothing). Pure: no clock, no
threads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

WINDOW_S = 3600.0
MIN_SPAN_S = 10.0
PRIOR_ARRIVALS = 1.0


@dataclass
class ArrivalRates:
    """Arrival times per class rank, and the rate of each class from them."""

    classes: tuple[int, ...] = (0, 1, 2)
    window_s: float = WINDOW_S
    min_span_s: float = MIN_SPAN_S
    prior_arrivals: float = PRIOR_ARRIVALS
    # shrink each class's rate towards the mean class rate (all arrivals counted over the
    # span, over the classes) with this many seconds of pseudo-observation (0: off, each
    # class on its own; session 15 cont., a replay variant)
    pool_s: float = 0.0
    # the classes pooled (None: all; (1, 2): the routine classes, URGENT on its own)
    pooled: tuple[int, ...] | None = None
    _times: dict[int, deque[float]] = field(default_factory=dict)
    _first: float | None = None

    def arrived(self, cls: int, at: float) -> None:
        """A job of class rank ``cls`` arrived (was queued) at ``at``."""
        self._times.setdefault(cls, deque(maxlen=10_000)).append(at)
        self._first = at if self._first is None else min(self._first, at)

    def extend(self, arrivals: Iterable[tuple[int, float]]) -> None:
        for cls, at in arrivals:
            self.arrived(cls, at)

    def seen(self) -> list[tuple[int, float]]:
        """Every arrival still counted (class rank, time), oldest first."""
        return sorted(
            ((cls, at) for cls, times in self._times.items() for at in times), key=lambda a: a[1]
        )

    def span(self, now: float) -> float | None:
        """Seconds the counts cover at ``now`` (None: nothing has arrived yet)."""
        if self._first is None:
            return None
        return min(self.window_s, max(self.min_span_s, now - self._first))

    def rates(self, now: float) -> dict[int, float]:
        """Arrivals per second of each class at ``now`` (empty before any arrival)."""
        return {cls: shape / span for cls, (shape, span) in self.posterior(now).items()}

    def posterior(self, now: float) -> dict[int, tuple[float, float]]:
        """Each class's rate as a Gamma posterior (shape, rate): the arrivals counted
        plus ``prior_arrivals``, over the span in seconds; its mean is :meth:`rates`.
        Its shape says how sure the rate is (session 15: one pseudo-arrival, a class
        not seen yet, is an exponential spread; six arrivals in 8 s, a tighter one)."""
        span = self.span(now)
        if span is None:
            return {}
        counts = {}
        for cls in self.classes:
            times = self._times.get(cls)
            while times and times[0] < now - self.window_s:
                times.popleft()
            counts[cls] = len(times) if times else 0
        group = self.classes if self.pooled is None else self.pooled
        pooled = self.pool_s * sum(counts.get(c, 0) for c in group) / span / max(1, len(group))
        out = {}
        for cls, count in counts.items():
            pool = self.pool_s if cls in group else 0.0
            shape = count + self.prior_arrivals + (pooled if pool else 0.0)
            if shape > 0:
                out[cls] = (shape, span + pool)
        return out


__all__ = ["MIN_SPAN_S", "PRIOR_ARRIVALS", "WINDOW_S", "ArrivalRates"]
