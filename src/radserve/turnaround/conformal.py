"""A band for the ETA from the finished jobs' errors: a split-conformal quantile.

The walk's band (:mod:`radserve.turnaround.eta`) is the overtaking work's Poisson 90th
percentile plus the job's own service-time noise; where the walk is early the band is
too (session 18: it held 81 % of the deep jobs' finishes over the kept traces, 41 % on
one). This band's late end is instead a quantile of what the finished jobs really took
over what was predicted at their first reading. Used by the replay
(:class:`radserve.turnaround.replay.Variant` ``band_quantile``), not by the server.
"""

from __future__ import annotations

from collections import deque


class ConformalBand:
    """The band's pessimistic end as a quantile of the finished jobs' actual / predicted
    time to finish at their first reading (a split-conformal band, session 18: the walk's
    own band is the overtaking's Poisson quantile and covered 81 % of the deep jobs)."""

    def __init__(self, quantile: float, window: int) -> None:
        self.quantile = quantile
        self.ratios: deque[float] = deque(maxlen=window)
        self.first: dict[str, tuple[float, float]] = {}  # job -> (read at, finish)

    def late(self, job_id: str, now: float, finish: float, late: float) -> float:
        self.first.setdefault(job_id, (now, finish))
        if len(self.ratios) < 3:
            return late
        ranked = sorted(self.ratios)
        ratio = ranked[min(len(ranked) - 1, int(self.quantile * len(ranked)))]
        return now + max(ratio, 1.0) * max(0.0, finish - now)

    def finished(self, job_id: str, at: float, succeeded: bool) -> None:
        first = self.first.pop(job_id, None)
        if first is not None and succeeded and first[1] - first[0] >= 1.0:
            self.ratios.append((at - first[0]) / (first[1] - first[0]))


__all__ = ["ConformalBand"]
