"""Each job's share of the server's wall time, measured: what the ETA walk's throughput
bound adds up.

The walk (:mod:`radserve.turnaround.eta`) bounds a job's finish by the work ranked ahead
of it. Summing the stage timings for that counts the sharing twice: a stage's wall time
already includes the other jobs that ran beside it (four routine jobs on two cores each
report a ``report`` stage 2-3x its time alone), so on a busy server the bound ran late
(docs/history/turnaround.md, session 10); alone-measured times, at a cold start, made it early.
Neither is the time the server *spends* on a job. This meter splits wall time among the
jobs running at each moment, equally, as the scheduler's events say (start, finish):
over any busy stretch the shares add up to exactly its wall time, so summing the shares
of the jobs ahead is how long the server takes to get through them at the concurrency
it really runs, whatever the cores, the GIL, or other processes on the host do to it.
While URGENT work runs under ``urgent_exclusive``, routine jobs are held (no batch of
theirs is dispatched, their CPU stages yield): the time is split among the URGENT jobs
alone. Pure: no clock, no threads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class ShareMeter:
    """Running jobs and the wall time each has been given so far."""

    urgent_holds: bool = True
    _urgent: dict[str, float] = field(default_factory=dict)  # job -> seconds so far
    _routine: dict[str, float] = field(default_factory=dict)
    _at: float | None = None

    def _advance(self, at: float) -> None:
        if self._at is not None and at > self._at:
            elapsed = at - self._at
            sharing = self._urgent if (self._urgent and self.urgent_holds) else None
            if sharing is None:
                sharing = {**self._urgent, **self._routine}
            if sharing:
                each = elapsed / len(sharing)
                for job in sharing:
                    if job in self._urgent:
                        self._urgent[job] += each
                    else:
                        self._routine[job] += each
        self._at = at if self._at is None else max(self._at, at)

    def started(self, job_id: str, at: float, urgent: bool) -> None:
        """The job started running at ``at``."""
        self._advance(at)
        if job_id not in self._urgent and job_id not in self._routine:
            (self._urgent if urgent else self._routine)[job_id] = 0.0

    def finished(self, job_id: str, at: float) -> float | None:
        """The job ended at ``at`` (any end): its share of wall time, None if its start
        was not seen."""
        self._advance(at)
        share = self._urgent.pop(job_id, None)
        return self._routine.pop(job_id, None) if share is None else share

    def so_far(self, job_id: str, at: float) -> float | None:
        """A running job's share up to ``at`` (None: not running)."""
        self._advance(at)
        share = self._urgent.get(job_id)
        return self._routine.get(job_id) if share is None else share


def shares_of_runs(
    runs: Iterable[tuple[str, float, float, bool]], urgent_holds: bool = True
) -> dict[str, float]:
    """Each job's share of wall time from its run (job, start, end, URGENT or not; one
    clock): the meter fed the starts and ends in time order (a start before an end at
    the same instant). Jobs that ran beside the ones given and are not among them are
    not seen, so give every job that ran over the stretch, whatever its end."""
    events = []
    for job, start, end, urgent in runs:
        events += [(start, 0, job, urgent), (end, 1, job, urgent)]
    meter = ShareMeter(urgent_holds=urgent_holds)
    out: dict[str, float] = {}
    for at, kind, job, urgent in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 0:
            meter.started(job, at, urgent)
        elif (share := meter.finished(job, at)) is not None:
            out[job] = share
    return out


@dataclass
class BesideMeter:
    """What a later job started beside a running one takes of the wall time of its run.

    Once a routine job runs, jobs that arrive after it and rank with or behind it (its
    own class, later deadline, or a lower class) start in the free slots and take wall
    time beside it; the ETA walk counted none of it (session 14: 8-15 % of a deep job's
    turnaround on the Zen 4 traces, ETAs early by as much). For each routine job that
    ends, this meter counts the jobs started during its run ranked with or behind it and
    the wall time they got before it ended (their :class:`ShareMeter` shares: all of it
    for one that ended first, its share so far for one still running); :meth:`mean_s`
    is that time per job started beside, over the last ``window`` runs. URGENT jobs are
    neither counted nor counted beside (they run alone and pass everything). Pure.
    """

    window: int = 200
    urgent_rank: int = 0
    per: str = "start"  # the seconds per job started beside, or per arrival in the run
    # running routine job -> (class rank, {job started beside it: its share, once ended})
    _open: dict[str, tuple[int, dict[str, float | None]]] = field(default_factory=dict)
    _arrived: dict[str, int] = field(default_factory=dict)  # running job -> arrivals
    _runs: deque[tuple[int, float]] = field(default_factory=deque)  # (jobs beside, seconds)

    def arrived(self, cls: int) -> None:
        """A job of class rank ``cls`` was queued."""
        for job, (rank, _) in self._open.items():
            if cls >= rank and cls != self.urgent_rank:
                self._arrived[job] = self._arrived.get(job, 0) + 1

    def started(self, job_id: str, cls: int) -> None:
        """The job of class rank ``cls`` started."""
        if cls == self.urgent_rank:
            return
        for rank, beside in self._open.values():
            if cls >= rank:
                beside[job_id] = None
        self._open.setdefault(job_id, (cls, {}))

    def finished(
        self, job_id: str, share: float | None, so_far: Callable[[str], float | None]
    ) -> None:
        """The job ended with ``share`` of the wall time; ``so_far``: a running job's
        share up to now (:meth:`ShareMeter.so_far` at this end)."""
        for _, beside in self._open.values():
            if job_id in beside:
                beside[job_id] = share or 0.0
        opened = self._open.pop(job_id, None)
        if opened is None:
            return
        beside = opened[1]
        took = sum(s if s is not None else (so_far(k) or 0.0) for k, s in beside.items())
        arrived = self._arrived.pop(job_id, 0)
        self._runs.append((len(beside) if self.per == "start" else arrived, took))
        while len(self._runs) > self.window:
            self._runs.popleft()

    def mean_s(self) -> float | None:
        """Seconds of wall time one job started beside a running one takes during that
        run (None: no job has yet been started beside one that ended)."""
        count = sum(n for n, _ in self._runs)
        return sum(t for _, t in self._runs) / count if count else None


__all__ = ["BesideMeter", "ShareMeter", "shares_of_runs"]
