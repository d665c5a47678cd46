"""How right the ETAs were, and how close the planner's simulation came, for one trace
that ran through a real server (``radserve bench --scenario eta``, radserve.bench.eta_trace).

Pure functions over what the client recorded: each job's arrival, actual finish, and
the ``predicted_finish`` it read from the job API at submission and afterwards. The ETA
error of a reading is ``|predicted_finish - finished| / (finished - arrival)``: relative
to the job's actual turnaround, as the issue states its goal (median ≤ 20 % for jobs
queued behind ≥ 3 others at submission).
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.turnaround.plan import ModelSampler, run_plan
from radserve.turnaround.service_time import RUN, ServiceTimeModel
from radserve.turnaround.simulate import Arrival

GOAL_MEDIAN_ERROR = 0.20
GOAL_PLANNER = 0.25
BEHIND = 3  # the goal counts jobs with at least this many unfinished jobs ahead
_WARMUP_POLL_S = 0.3  # the bench's warm-up polls every 0.25 s, then submits the next


@dataclass(frozen=True)
class Reading:
    """One ETA read from the job API: when (POSIX s), the job's state then, its
    predicted finish and the pessimistic end of its band (POSIX s), and its order
    position (0 = first among unfinished jobs)."""

    at: float
    state: str
    predicted_finish: float
    position: int
    predicted_finish_late: float | None = None


@dataclass
class JobTrace:
    job_id: str
    cls: PriorityClass
    arrival: float
    finished: float | None = None
    state: str = "queued"
    readings: list[Reading] = field(default_factory=list)
    slices: int | None = None  # the study's size, when the client knows it

    @property
    def tat(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    def reading(self, point: str) -> Reading | None:
        """The reading at ``submission`` (the first), ``start`` (the first while
        running) or ``halfway`` (the one nearest arrival + TAT / 2)."""
        if not self.readings:
            return None
        if point == "submission":
            return self.readings[0]
        if point == "start":
            return next((r for r in self.readings if r.state == "running"), None)
        if point == "halfway" and self.tat is not None:
            middle = self.arrival + self.tat / 2
            return min(self.readings, key=lambda r: abs(r.at - middle))
        return None

    def error(self, point: str, *, late: bool = False) -> tuple[float, float, float] | None:
        """(absolute error s, error / TAT, signed error / TAT) of the reading at
        ``point`` (``late``: of its band's pessimistic end); signed < 0: early."""
        reading, tat = self.reading(point), self.tat
        if reading is None or tat is None or tat <= 0 or self.finished is None:
            return None
        predicted = reading.predicted_finish_late if late else reading.predicted_finish
        if predicted is None:
            return None
        signed = predicted - self.finished
        return abs(signed), abs(signed) / tat, signed / tat


def _summary(errors: Sequence[tuple[float, float, float]]) -> dict[str, object]:
    if not errors:
        return {"jobs": 0}
    absolute = np.array([e[0] for e in errors])
    relative = np.array([e[1] for e in errors])
    return {
        "jobs": len(errors),
        "median_rel": round(float(np.median(relative)), 4),
        "p90_rel": round(float(np.percentile(relative, 90)), 4),
        "mean_abs_s": round(float(absolute.mean()), 3),
        "median_abs_s": round(float(np.median(absolute)), 3),
        # < 0: the ETAs were early (optimistic), > 0: late
        "median_signed_rel": round(float(np.median([e[2] for e in errors])), 4),
    }


def eta_errors(jobs: Sequence[JobTrace], *, late: bool = False) -> dict[str, object]:
    """Per reading point, over the succeeded jobs: all of them, and those queued behind
    ≥ ``BEHIND`` others at submission (the issue's goal). ``late``: the error of the
    band's pessimistic end (``predicted_finish_late``) instead of ``predicted_finish``."""
    done = [j for j in jobs if j.state == "succeeded" and j.tat is not None]
    out: dict[str, object] = {}
    for point in ("submission", "start", "halfway"):
        errors = [e for j in done if (e := j.error(point, late=late)) is not None]
        behind = [
            e
            for j in done
            if (first := j.reading("submission")) is not None
            and first.position >= BEHIND
            and (e := j.error(point, late=late)) is not None
        ]
        out[point] = {"all": _summary(errors), f"behind_{BEHIND}": _summary(behind)}
    goal = out["submission"][f"behind_{BEHIND}"]  # type: ignore[index]
    median = goal.get("median_rel")
    out["goal_median_rel"] = GOAL_MEDIAN_ERROR
    out["meets_goal"] = None if median is None else median <= GOAL_MEDIAN_ERROR
    return out


def measured_tats(jobs: Sequence[JobTrace]) -> dict[PriorityClass, tuple[float, float, int]]:
    """Per class: (p50, p95, jobs) of the measured turnaround of succeeded jobs."""
    out = {}
    for cls in PriorityClass:
        tats = [j.tat for j in jobs if j.cls is cls and j.state == "succeeded" and j.tat]
        if tats:
            out[cls] = (
                float(np.percentile(tats, 50)),
                float(np.percentile(tats, 95)),
                len(tats),
            )
    return out


def planner_check(
    jobs: Sequence[JobTrace],
    model: ServiceTimeModel,
    group: tuple[str, str, str],
    *,
    scheduler: SchedulerSettings,
    cpu_workers: int,
    devices: int = 1,
    seeds: int = 10,
    cores_per_device: int | None = None,
    fillers: Sequence[tuple[float, PriorityClass, int | None]] = (),
    noise_per_class: bool = False,
    noise_by_size: bool = True,
    fine_units: bool = False,
) -> dict[str, object]:
    """``radserve plan``'s simulation of this trace (its arrivals and classes, and the
    unmeasured ``fillers`` that kept the stream going before and after them: POSIX
    arrival, class, slices), with the service times the server learned, against the
    measured per-class p50/p95 TAT of the measured jobs. Each job's work is drawn at its
    own study's size when every size is known (else at sizes drawn from those the model
    saw). The simulation's figures are medians over ``seeds`` seeds (service-time draws)
    and count only the measured jobs; ``noise_per_class``: times alone draw each job's
    noise from its own class's jobs, ``noise_by_size`` (the default): from the jobs
    nearest its size, else from all; ``fine_units``: each job in the server's units per
    model (:class:`ModelSampler`)."""
    events = sorted(
        [(j.arrival, j.cls, j.slices, True) for j in jobs]
        + [(t, c, n, False) for t, c, n in fillers],
        key=lambda e: e[0],
    )
    start = events[0][0]
    sampler = ModelSampler(
        model,
        *group,
        batch_slices=scheduler.max_batch_size,
        per_class=noise_per_class,
        by_size=noise_by_size,
        fine=fine_units,
    )
    sized = all(e[2] is not None for e in events)

    def trace(seed: int) -> list[Arrival]:
        rng = np.random.default_rng([seed, 1])
        return [
            Arrival(
                at - start,
                cls,
                sampler.service(rng, n, cls) if sized and n is not None else None,
                measured,
            )
            for at, cls, n, measured in events
        ]

    runs = [
        run_plan(
            trace(seed),
            sampler,
            devices=devices,
            cpu_workers=cpu_workers,
            scheduler=scheduler,
            seed=seed,
            warmup_s=0.0,
            cores_per_device=cores_per_device,
        ).result
        for seed in range(seeds)
    ]
    classes: dict[str, object] = {}
    within = []
    for cls, (p50, p95, n) in measured_tats(jobs).items():
        sims = [r.classes[cls] for r in runs if cls in r.classes]
        if not sims:
            continue
        s50 = statistics.median(c.tat_p50_s for c in sims)
        s95 = statistics.median(c.tat_p95_s for c in sims)
        d50, d95 = _rel(s50, p50), _rel(s95, p95)
        within += [d50 <= GOAL_PLANNER, d95 <= GOAL_PLANNER]
        classes[cls.value] = {
            "jobs": n,
            "measured_p50_s": round(p50, 3),
            "predicted_p50_s": round(s50, 3),
            "diff_p50": round(d50, 4),
            "measured_p95_s": round(p95, 3),
            "predicted_p95_s": round(s95, 3),
            "diff_p95": round(d95, 4),
        }
    return {
        "service_times": {"pipeline": group[0], "device": group[1], "precision": group[2]},
        "jobs_learned_from": len(model.sizes()),
        "devices": devices,
        "cpu_workers": cpu_workers,
        "host_cores_per_device": cores_per_device,
        "seeds": seeds,
        "sizes": "per job" if sized else "drawn",
        "classes": classes,
        "goal_rel": GOAL_PLANNER,
        "within_goal": all(within) if within else None,
    }


def read_summary(path: Path) -> dict[str, Any]:
    """A saved ``radserve bench --scenario eta --json`` run (gzipped if it ends .gz, as
    the traces kept in ``tests/data/eta-traces/``)."""
    data = Path(path).read_bytes()
    return dict(json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data))


def arrivals_before(summary: Mapping[str, Any]) -> list[tuple[int, float]]:
    """The arrivals (class rank, scheduler clock s) the server had counted when a saved
    run's recording began: recorded since 2026-12-02 session 11 (``arrivals_at_start``);
    before, the warm-up studies (OUTPATIENT, one at a time) taken to have arrived back to
    back just before the first recorded walk, each its run (from the model saved at the
    start) and 0.3 s of polling before the next: an approximation, so a replay that
    counts the rates again is not exactly what that server would have counted."""
    if "arrivals_at_start" in summary:
        return [(int(cls), float(at)) for cls, at in summary["arrivals_at_start"]]
    walks = [r["at"] for r in summary.get("eta_records", []) if r["kind"] == "walk"]
    model = summary.get("service_times_at_start") or {}
    runs = next((r["seconds"] for r in model.get("samples", []) if r["step"] == RUN), [])
    if not walks:
        return []
    at, out = float(min(walks)), []
    for run in reversed(runs):
        at -= float(run) + _WARMUP_POLL_S
        out.append((PriorityClass.OUTPATIENT.rank, at))
    return out[::-1]


def offered_load(
    records: Sequence[Mapping[str, Any]], measured: Sequence[str], mean_gap_s: float
) -> float | None:
    """The load the stream offered the server: its measured jobs' mean share of the wall
    time (:func:`radserve.turnaround.replay.shares_of`, what each really took at the
    concurrency it ran) over the mean gap between arrivals. ``--load`` is a multiple of
    one study's solo time, while the server runs several at once, so it says less: above
    1 here the server cannot drain the stream and the queue grows while it lasts
    (session 30: ``--load 1.5`` offered 1.33-1.45 on the AMX host, ``--load 1.0`` 0.83-0.88)."""
    from radserve.turnaround.replay import shares_of

    walks = [r for r in records if r["kind"] == "walk"]
    if not walks or mean_gap_s <= 0:
        return None
    shares = shares_of(records, bool(walks[0]["capacity"]["urgent_exclusive"]))
    taken = [shares[j] for j in measured if j in shares]
    return round(statistics.mean(taken) / mean_gap_s, 3) if taken else None


def _rel(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured > 0 else float("inf")


def group_of(model: ServiceTimeModel, pipeline: str, precision: str) -> tuple[str, str, str]:
    """The model's (pipeline, device, precision) group the trace ran under."""
    return next(
        (g for g in model.groups() if g[0] == pipeline and g[2] == precision),
        (pipeline, "cpu", precision),
    )


def classes_seen(jobs: Sequence[JobTrace]) -> Mapping[str, int]:
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.cls.value] = counts.get(j.cls.value, 0) + 1
    return counts


__all__ = [
    "BEHIND",
    "JobTrace",
    "Reading",
    "arrivals_before",
    "classes_seen",
    "eta_errors",
    "group_of",
    "measured_tats",
    "planner_check",
    "read_summary",
]
