"""Where an URGENT job's turnaround went, from a trace of every unit the executor ran.

:class:`TracingScheduler` is the real :class:`~radserve.scheduling.Scheduler` that also
notes each completed unit (its kind, job(s), stage, start and end on the scheduler's
clock). :func:`urgent_breakdown` cuts the URGENT job's window (submission to result) in
two: time when one of its own units ran (``busy_s``; longer under load when routine
work shares the cores) and time when none did (``gap_s``), and says which routine work
was running in those gaps (a batch on the device, which CPU stage) and how much
routine work started inside the window at all. It is what the ``priority`` bench
reports under ``urgent_breakdown``, so a regression shows where the wait came from.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from radserve.scheduling import (
    BatchDispatch,
    Dispatch,
    DispatchOutcome,
    InProcessExecutor,
    MergeDispatch,
    PrepareDispatch,
    Scheduler,
)


@dataclass(frozen=True)
class Unit:
    """One dispatched unit as it ran: ``kind`` is batch, prepare, merge or the CPU stage's
    name (ingest, '<model>: postprocess', report)."""

    kind: str
    jobs: tuple[str, ...]
    start: float
    end: float

    @classmethod
    def of(cls, dispatch: Dispatch, end: float) -> Unit:
        if isinstance(dispatch, BatchDispatch):
            jobs = tuple(dict.fromkeys(p.job_id for p in dispatch.parts))
            return cls("device batch", jobs, dispatch.started, end)
        if isinstance(dispatch, PrepareDispatch):
            kind = "prepare"
        elif isinstance(dispatch, MergeDispatch):
            kind = "merge"
        else:
            kind = dispatch.stage.name
        return cls(kind, (dispatch.job_id,), dispatch.started, end)


class TracingScheduler(Scheduler):
    """A :class:`Scheduler` that keeps every completed unit in ``trace`` (bench only)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.trace: list[Unit] = []
        self._trace_lock = threading.Lock()

    def complete(self, dispatch: Dispatch, outcome: DispatchOutcome) -> None:
        unit = Unit.of(dispatch, self.clock.now())
        with self._trace_lock:
            self.trace.append(unit)
        super().complete(dispatch, outcome)


class TracingExecutor(InProcessExecutor):
    """An :class:`InProcessExecutor` that notes when routine work paused at a checkpoint
    (``pauses``: start and end on the scheduler's clock, one entry per paused thread; a
    paused worker thread may have run URGENT units meanwhile)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.pauses: list[tuple[float, float]] = []
        self._pause_lock = threading.Lock()

    def _yield(self, owner: threading.Thread) -> None:
        clock = self.scheduler.clock
        start = clock.now()
        super()._yield(owner)
        end = clock.now()
        if end > start:
            with self._pause_lock:
                self.pauses.append((start, end))


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def urgent_breakdown(
    trace: list[Unit],
    job_id: str,
    submitted: float,
    ended: float,
    pauses: Sequence[tuple[float, float]] = (),
) -> dict[str, object]:
    """The URGENT job's window [``submitted``, ``ended``] (scheduler clock) cut into its
    own units' time and the gaps between them, with the routine work beside each.

    ``routine_beside_s`` counts each routine unit's whole span inside the window, paused
    or not; ``routine_paused_s`` how much of it routine threads spent paused at their
    checkpoints (summed over threads)."""
    window = (submitted, ended)
    own = [u for u in trace if job_id in u.jobs]
    others = [u for u in trace if job_id not in u.jobs and _overlap((u.start, u.end), window)]
    busy = _union([(max(u.start, submitted), min(u.end, ended)) for u in own])
    busy_s = sum(e - s for s, e in busy)
    gaps, cursor = [], submitted
    for start, end in busy:
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if ended > cursor:
        gaps.append((cursor, ended))
    own_s: dict[str, float] = defaultdict(float)
    for u in own:
        own_s[u.kind] += u.end - u.start
    beside: dict[str, float] = defaultdict(float)  # routine work overlapping the window
    in_gaps: dict[str, float] = defaultdict(float)  # ... overlapping the gaps
    for u in others:
        beside[u.kind] += _overlap((u.start, u.end), window)
        for gap in gaps:
            in_gaps[u.kind] += _overlap((u.start, u.end), gap)
    started_inside = [u for u in others if u.start >= submitted]
    return {
        "window_s": ended - submitted,
        "busy_s": busy_s,
        "gap_s": (ended - submitted) - busy_s,
        "first_unit_after_s": (min(u.start for u in own) - submitted) if own else None,
        "own_units_s": dict(own_s),
        "routine_beside_s": dict(beside),
        "routine_paused_s": sum(_overlap(pause, window) for pause in pauses),
        "routine_in_gaps_s": dict(in_gaps),
        "routine_units_started_inside": len(started_inside),
        "routine_seconds_started_inside": sum(min(u.end, ended) - u.start for u in started_inside),
    }


__all__ = ["TracingExecutor", "TracingScheduler", "Unit", "urgent_breakdown"]
