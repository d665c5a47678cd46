"""Replay the server's ETA computation offline, on what a run recorded.

The server (``Turnaround.recorder``, set by ``radserve bench --scenario eta``) records
every walk's inputs (its clock, the entries in queue order with their service-time
estimates, the capacity with the arrival rates it saw) and every job's end. ETAs are a
pure function of those inputs plus the online bias correction, which learns only from
the recorded ends, so a variant of the walk or of the correction can be tried on a
recorded trace deterministically, without running the server again: :func:`replay`
walks every recorded snapshot again under a :class:`Variant` and returns each job's ETA
at submission (its first walk) and halfway (the walk nearest the middle of its
turnaround), in the scheduler's clock. The recorded run's own scheduling is kept: a
variant changes the predictions, not what the server did (the default ``risk_policy``
``none`` does not act on ETAs).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radserve.turnaround.bias import BiasCorrection
from radserve.turnaround.drain import DrainMeter
from radserve.turnaround.eta import Arrivals, Capacity, Entry, walk
from radserve.turnaround.service_time import JobEstimate


def walk_record(now: float, entries: Sequence[Entry], capacity: Capacity) -> dict[str, Any]:
    """One walk's inputs as JSON-ready data (compact: entries as lists)."""
    return {
        "kind": "walk",
        "at": now,
        "entries": [
            [e.job_id, e.cls, e.running, e.deadline, e.started, *_estimate(e.estimate)]
            for e in entries
        ],
        "capacity": {
            **{f.name: getattr(capacity, f.name) for f in dataclasses.fields(capacity)},
            "arrivals": [[a.cls, a.rate_per_s, *_estimate(a.estimate)] for a in capacity.arrivals],
            "tat_s": list(capacity.tat_s),
        },
    }


def _estimate(e: JobEstimate) -> list[Any]:
    return [e.cpu_s, e.device_s, e.latency_s, e.spread_s, e.source]


def _job_estimate(values: Sequence[Any]) -> JobEstimate:
    return JobEstimate(*(float(v) for v in values[:4]), str(values[4]))


def walk_inputs(record: Mapping[str, Any]) -> tuple[float, list[Entry], Capacity]:
    """The inverse of :func:`walk_record`."""
    entries = [
        Entry(str(r[0]), int(r[1]), bool(r[2]), float(r[3]), r[4], _job_estimate(r[5:]))
        for r in record["entries"]
    ]
    raw = dict(record["capacity"])
    raw["arrivals"] = tuple(
        Arrivals(int(a[0]), float(a[1]), _job_estimate(a[2:])) for a in raw["arrivals"]
    )
    raw["tat_s"] = tuple(raw["tat_s"])
    return float(record["at"]), entries, Capacity(**raw)


@dataclass(frozen=True)
class Variant:
    """What the replay changes: the allowance for later arrivals of classes ranked ahead
    (``allowance``), and the online bias correction (``bias``: ``off``; ``class``, the
    server's, one factor per class; ``queued``, the class factor applied to queued jobs
    only, as it was learned from queued jobs; ``depth``, one factor per class and queue
    depth at the walk, :class:`radserve.turnaround.bias.BiasCorrection` keyed by both),
    and the
    measured drain rate (``drain``: True, learned from the recorded walks and ends as
    the server learns it, :class:`radserve.turnaround.drain.DrainMeter`; False, the
    model's alone; None, as recorded)."""

    allowance: bool = True
    bias: str = "off"  # the server's default (turnaround.bias_window_jobs 0)
    window: int = 20
    drain: bool | None = None


@dataclass
class Replayed:
    """One job's ETAs in a replay (scheduler clock) and its recorded end."""

    job_id: str
    cls: int
    arrival: float  # its first walk (the server walks at once on a submission)
    position: int  # jobs ranked ahead of it at submission
    first: float  # predicted finish at submission
    end: float | None = None
    state: str | None = None
    readings: list[tuple[float, float]] = dataclasses.field(default_factory=list)

    def halfway(self) -> float | None:
        """The predicted finish read nearest the middle of the turnaround."""
        if self.end is None or not self.readings:
            return None
        middle = (self.arrival + self.end) / 2
        return min(self.readings, key=lambda r: abs(r[0] - middle))[1]


def _depth(position: int) -> int:
    """Queue-depth bucket for the ``depth`` bias: 0, 1-2, 3-6, 7+ jobs ahead."""
    return 0 if position == 0 else 1 if position <= 2 else 2 if position <= 6 else 3


def replay(records: Iterable[Mapping[str, Any]], variant: Variant = Variant()) -> list[Replayed]:
    """Walk every recorded snapshot again under ``variant``; each job's ETAs."""
    bias = BiasCorrection(window=variant.window if variant.bias != "off" else 0)
    meter = DrainMeter()
    saturated = False
    work: dict[str, float] = {}  # job -> its model work as the walk counts it
    jobs: dict[str, Replayed] = {}
    learn: dict[str, tuple[int, float, float]] = {}  # job -> (key, walked at, raw finish)
    for record in sorted(records, key=lambda r: (r["at"], r["kind"] != "end")):
        if record["kind"] == "end":
            job = jobs.get(record["job"])
            if job is None:
                continue
            job.end, job.state = float(record["at"]), str(record["state"])
            if job.state == "succeeded" and job.job_id in work:
                meter.completed(job.end, work[job.job_id], saturated)
            first = learn.pop(job.job_id, None)
            if first is not None and job.state == "succeeded":
                key, walked_at, raw = first
                bias.observe(key, raw - walked_at, job.end - walked_at)
            continue
        now, entries, capacity = walk_inputs(record)
        if not variant.allowance:
            capacity = dataclasses.replace(capacity, arrivals=())
        saturated = any(not e.running for e in entries)
        meter.saturation(now, saturated)
        for e in entries:
            work[e.job_id] = capacity.model_work_s(e.estimate.cpu_s, e.estimate.device_s)
        if variant.drain is not None:
            drain = meter.factor() if variant.drain else 1.0
            capacity = dataclasses.replace(capacity, drain=drain)
        for eta, entry in zip(walk(entries, now, capacity), entries, strict=True):
            key = entry.cls if variant.bias != "depth" else entry.cls * 10 + _depth(eta.position)
            learn.setdefault(eta.job_id, (key, now, eta.finish))
            finish = eta.finish
            if variant.bias != "queued" or not entry.running:
                finish = bias.correct(learn[eta.job_id][0], now, eta.finish)
            job = jobs.get(eta.job_id)
            if job is None:
                job = jobs[eta.job_id] = Replayed(eta.job_id, entry.cls, now, eta.position, finish)
            job.readings.append((now, finish))
    return list(jobs.values())


def errors(
    jobs: Sequence[Replayed], measured: Collection[str] | None = None, behind: int = 3
) -> dict[str, Any]:
    """Median relative error (|predicted - end| / TAT) and bias (signed) at submission
    and halfway, over succeeded ``measured`` jobs: all, and those behind >= ``behind``."""
    done = [
        j
        for j in jobs
        if j.state == "succeeded"
        and j.end is not None
        and j.end > j.arrival
        and (measured is None or j.job_id in measured)
    ]
    out: dict[str, Any] = {}
    deep = [j for j in done if j.position >= behind]
    for name, subset in (("all", done), (f"behind_{behind}", deep)):
        row: dict[str, Any] = {"jobs": len(subset)}
        for point in ("submission", "halfway"):
            signed = []
            for j in subset:
                predicted = j.first if point == "submission" else j.halfway()
                if predicted is not None and j.end is not None:
                    signed.append((predicted - j.end) / (j.end - j.arrival))
            if signed:
                row[point] = {
                    "median_rel": round(statistics.median(abs(s) for s in signed), 4),
                    "median_signed_rel": round(statistics.median(signed), 4),
                }
        out[name] = row
    return out


def log_ratio_spread(jobs: Sequence[Replayed]) -> float:
    """Median |log(actual / predicted)| of the time to finish at submission (a scale-free
    figure of how far the walk is from the truth)."""
    logs = [
        abs(math.log((j.end - j.arrival) / (j.first - j.arrival)))
        for j in jobs
        if j.end is not None and j.first > j.arrival and j.end > j.arrival
    ]
    return statistics.median(logs) if logs else float("nan")


__all__ = ["Replayed", "Variant", "errors", "replay", "walk_inputs", "walk_record"]
