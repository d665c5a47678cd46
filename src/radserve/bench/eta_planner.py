"""The planner check replayed on a saved ``radserve bench --scenario eta --json`` run:
the same arrivals, classes and study sizes simulated with this tree's planner under a
named model of the host, against the run's measured per-class p50/p95 TAT. Judges a
change to the simulation or to the service times it draws on a trace already measured
(``tools/eta_planner_replay.py`` prints every model; the regression test holds the
default on the quiet traces in ``tests/data/eta-traces/``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from radserve.bench.eta_accuracy import JobTrace, group_of, planner_check
from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.turnaround.eta import on_host_cores
from radserve.turnaround.service_time import ServiceTimeModel
from radserve.turnaround.simulate import SimConfig
from radserve.turnaround.solo import (
    Division,
    SoloTimes,
    divide,
    model_of,
    runs_from_end_records,
)

DEFAULT = "solo times from the trace, shared cores"  # radserve plan's on a CPU device
FINE = "solo times from the trace, shared cores, server's units"
CONSISTENT = "solo times consistent with the simulation, shared cores"
CONSISTENT_FINE = "solo times consistent with the simulation, shared cores, server's units"
# name: (service times, shared cores, per-class noise, noise by size, server's units)
MODELS: dict[str, tuple[str, bool, bool, bool, bool]] = {
    # the times the run learned, the device as hardware apart from the CPU pool
    # (radserve plan before 2026-12-02)
    "trace times, separate hardware": ("trace", False, False, True, False),
    # the same on processor-shared cores: the sharing counted twice (the times hold it)
    "trace times, shared cores": ("trace", True, False, True, False),
    # the warm-up studies' times (run alone)
    "warm-up solo times, shared cores": ("warm-up solo", True, False, True, False),
    # the trace's own jobs with the sharing divided out (radserve.turnaround.solo); each
    # job's noise from the jobs nearest its size, weighted by how alone they ran
    DEFAULT: ("solo from the trace", True, False, True, False),
    # session 10: each class's noise from its own jobs' ratios (not the default)
    "solo from the trace, noise per class": ("solo from the trace", True, True, True, False),
    # before 2026-12-02 session 12: every job's noise from all jobs' ratios
    "solo from the trace, pooled noise": ("solo from the trace", True, False, False, False),
    # the default with each job as the server's units per model (prepare, infer, merge
    # per batch, feed work first, a feeder thread per device; post-processing; report):
    # radserve.turnaround.units
    FINE: ("solo from the trace", True, False, True, True),
    # session 15: the division made consistent with the simulation's sharing
    # (radserve.turnaround.solo.consistent_timings), coarse jobs and the server's units
    CONSISTENT: ("solo consistent", True, False, True, False),
    CONSISTENT_FINE: ("solo consistent", True, False, True, True),
}


def divided_records(records: Iterable[Mapping[str, Any]], cores: int, cpu_workers: int) -> Division:
    """A run's own jobs (their end records) with the sharing they ran under divided out,
    as ``radserve plan`` divides them from the store on a CPU device
    (radserve.turnaround.solo)."""
    return divide(
        runs_from_end_records(records),
        cores,
        # the server's CPU workers, its URGENT lane and a batch on every core
        max_threads=cpu_workers + 1 + cores,
    )


def solo_from_records(
    division: Division,
    prior_model: ServiceTimeModel,
    group: tuple[str, str, str],
    host: SimConfig | None = None,
) -> SoloTimes:
    """The jobs' times alone (:func:`divided_records`) as a model; ``host``: made
    consistent with that simulated host."""
    return model_of(
        division,
        prior=prior_model.prior,
        pipeline=group[0],
        device=group[1],
        precision=group[2],
        host=host,
    )


def recorded_jobs(summary: Mapping[str, Any]) -> list[JobTrace]:
    """The measured jobs of a saved run (arrival and finish on its own clock)."""
    return [
        JobTrace(
            row["id"],
            PriorityClass.parse(row["class"]),
            row["arrival_s"],
            None if row["tat_s"] is None else row["arrival_s"] + row["tat_s"],
            row["state"],
            slices=row.get("slices"),
        )
        for row in summary["jobs"]
    ]


def replay_planner(
    summary: Mapping[str, Any], cores: int | None = None, names: Sequence[str] | None = None
) -> dict[str, dict[str, object]]:
    """The planner check (:func:`planner_check`) of ``summary``'s trace under each model
    in ``names`` (default: every one in :data:`MODELS` the run has the data for), with
    the scheduler the server had (batches capped at the CPU device's ``CPU_MAX_BATCH``
    slices); ``cores``: the host's (default: the run's usable cores on a CPU device)."""
    from radserve.inference.providers import CPU_MAX_BATCH  # loads onnxruntime: here only

    # the unmeasured arrivals that kept the stream going (runs before they existed: none)
    fillers = [
        (f[0], PriorityClass.parse(f[1]), f[2] if len(f) > 2 else None)
        for f in summary.get("fillers", [])
    ]
    host = on_host_cores(summary["device"])
    if cores is None and host:
        cores = summary["host"]["usable_cores"]
    server = SchedulerSettings().capped(CPU_MAX_BATCH if host else None)
    trace = ServiceTimeModel.from_json(summary["service_times"])
    group = group_of(trace, summary["pipeline"], "fp32")
    models: dict[str, ServiceTimeModel] = {
        "trace": trace,
        "warm-up solo": ServiceTimeModel.from_json(summary["service_times_solo"]),
    }
    if "eta_records" in summary and cores is not None:
        # divided once: both solo models start from the same division
        division = divided_records(summary["eta_records"], cores, summary["cpu_workers"])
        models["solo from the trace"] = solo_from_records(division, trace, group)
        wanted = names if names is not None else MODELS
        if any(MODELS[n][0] == "solo consistent" for n in wanted):
            host_model = SimConfig(1, summary["cpu_workers"], server, host_cores=cores)
            models["solo consistent"] = solo_from_records(division, trace, group, host_model)
    jobs = recorded_jobs(summary)
    out = {}
    for name in names if names is not None else MODELS:
        key, shared, per_class, by_size, fine = MODELS[name]
        if key not in models:
            continue
        out[name] = planner_check(
            jobs,
            models[key],
            group,
            scheduler=server,
            cpu_workers=summary["cpu_workers"],
            cores_per_device=cores if shared else None,
            fillers=fillers,
            noise_per_class=per_class,
            noise_by_size=by_size,
            fine_units=fine,
        )
    return out


def cells_within(check: Mapping[str, Any]) -> tuple[int, int]:
    """(cells within the goal, cells) of a planner check: p50 and p95 per class."""
    rows = check["classes"].values()
    goal = check["goal_rel"]
    return sum((r["diff_p50"] <= goal) + (r["diff_p95"] <= goal) for r in rows), 2 * len(rows)


__all__ = [
    "CONSISTENT",
    "CONSISTENT_FINE",
    "DEFAULT",
    "FINE",
    "MODELS",
    "cells_within",
    "divided_records",
    "recorded_jobs",
    "replay_planner",
    "solo_from_records",
]
