"""A band for the ETA from the finished jobs' errors: a split-conformal quantile.

The walk's band (:mod:`radserve.turnaround.eta`) is the overtaking work's Poisson 90th
percentile plus the job's own service-time noise; where the walk is early the band is
too (session 18: it held 81 % of the deep jobs' finishes over the kept traces, 41 % on
one). This band's late end is instead a quantile of what the finished jobs really took
over what was predicted at their first reading: held 88-89 % of the deep jobs' finishes
in the replay (:class:`radserve.turnaround.replay.Variant` ``band_quantile``). The
server's with ``turnaround.band: conformal`` (:mod:`radserve.service.turnaround`).

Memory is bounded: ``window`` ratios, and one first reading per unfinished job (popped
at its end, whatever the end). Pure: no clock, no threads (the server holds it under its
own lock). Not kept across a restart (as the bias is not): until ``MIN_JOBS`` finish
after a start, the walk's own band answers.
"""

from __future__ import annotations

from collections import deque

MIN_JOBS = 3  # finished jobs before the quantile replaces the walk's own band
_MIN_PREDICTED_S = 1.0  # a prediction of under a second teaches nothing about the ratio


class ConformalBand:
    """The band's pessimistic end as a quantile of the finished jobs' actual / predicted
    time to finish at their first reading (a split-conformal band, session 18: the walk's
    own band is the overtaking's Poisson quantile and covered 81 % of the deep jobs)."""

    def __init__(self, quantile: float, window: int) -> None:
        self.quantile = quantile
        self.ratios: deque[float] = deque(maxlen=window)
        self.first: dict[str, tuple[float, float]] = {}  # job -> (read at, finish)
        self._ratio: float | None = None  # the quantile, kept until the next job ends

    def ratio(self) -> float | None:
        """The ``quantile`` of the ratios learned (None: fewer than ``MIN_JOBS``)."""
        if self._ratio is None and len(self.ratios) >= MIN_JOBS:  # one sort per end
            ranked = sorted(self.ratios)
            self._ratio = ranked[min(len(ranked) - 1, int(self.quantile * len(ranked)))]
        return self._ratio

    def reading(self, job_id: str, now: float, finish: float) -> None:
        """A job predicted at ``now`` to finish at ``finish``: its first reading is kept
        to learn from when it ends (the server's; the walk applies :meth:`ratio`)."""
        self.first.setdefault(job_id, (now, finish))

    def late(self, job_id: str, now: float, finish: float, late: float) -> float:
        """The band's late end for a job predicted at ``now`` to finish at ``finish``
        (its first reading is kept to learn from): ``now`` plus the time to finish
        scaled by the quantile ratio (at least 1), or the walk's ``late`` until learned."""
        self.first.setdefault(job_id, (now, finish))
        ratio = self.ratio()
        if ratio is None:
            return late
        return now + max(ratio, 1.0) * max(0.0, finish - now)

    def finished(self, job_id: str, at: float, succeeded: bool) -> None:
        """A job ended at ``at``: a succeeded one teaches its first reading's ratio."""
        first = self.first.pop(job_id, None)
        if first is not None and succeeded and first[1] - first[0] >= _MIN_PREDICTED_S:
            self.ratios.append((at - first[0]) / (first[1] - first[0]))
            self._ratio = None

    def describe(self) -> dict[str, float | int | None]:
        """Jobs learned from and the late end's ratio now (None: the walk's band)."""
        ratio = self.ratio()
        return {"jobs": len(self.ratios), "ratio": None if ratio is None else round(ratio, 4)}


__all__ = ["MIN_JOBS", "ConformalBand"]
