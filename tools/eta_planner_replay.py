"""Replay the planner check of a saved ``radserve bench --scenario eta --json`` run with
the simulation in this tree: the same arrivals and classes, against the run's measured
per-class p50/p95 TAT, under several models of the host. Lets a change to the host model
be judged on a trace already measured, without running the server again.

Models (service times / host):
- ``trace times, separate hardware``: the times the run learned (``service_times``), the
  device simulated as hardware apart from the CPU pool (``radserve plan`` before
  2026-12-02);
- ``trace times, shared cores``: the same times on processor-shared cores (counts the
  sharing twice: the times include it);
- ``warm-up solo times, shared cores``: the warm-up studies' times (run alone);
- ``solo times from the trace, shared cores``: the trace's own jobs (end records) with the
  concurrency they ran under divided out (:mod:`radserve.turnaround.solo`), ``radserve
  plan``'s default on a CPU device since 2026-12-02.

Each runs with the scheduler the server had (batches capped at the CPU device's
``CPU_MAX_BATCH`` slices, ``yield_to_urgent``). The checks the bench itself made when it
ran (``planner``, ``planner_separate_hardware``, ``planner_shared_cores``,
``planner_host_model``: the code of that commit) are printed first.

    PYTHONPATH=src python tools/eta_planner_replay.py out/eta.json [more.json ...] [--cores N]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import JobTrace, group_of, planner_check, read_summary
from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.inference.providers import CPU_MAX_BATCH
from radserve.turnaround.eta import on_host_cores
from radserve.turnaround.service_time import ServiceTimeModel
from radserve.turnaround.solo import runs_from_end_records, solo_model

RECORDED = {
    "planner": "as run: trace times, separate hardware",  # before session 10: see below
    "planner_separate_hardware": "as run: trace times, separate hardware",
    "planner_shared_cores": "as run: trace times, shared cores",
    "planner_host_model": "as run: warm-up solo times, shared cores",
}


def _recorded(summary: dict[str, Any]) -> dict[str, Any]:
    """The checks the bench made when it ran, by the model each used (``planner`` is
    radserve plan's default since session 10, named by ``planner_model``)."""
    out = {}
    for key, name in RECORDED.items():
        if key == "planner" and "planner_model" in summary:
            name = f"as run: {summary['planner_model']}"
        if summary.get(key):
            out[name] = summary[key]
    return out


def replay(summary: dict[str, Any], cores: int | None) -> dict[str, Any]:
    jobs = [
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
    models = {
        "trace": trace,
        "warm-up solo": ServiceTimeModel.from_json(summary["service_times_solo"]),
    }
    if "eta_records" in summary and cores is not None:
        models["solo from the trace"] = solo_model(
            runs_from_end_records(summary["eta_records"]),
            cores,
            prior=trace.prior,
            pipeline=group[0],
            device=group[1],
            precision=group[2],
            # the server's CPU workers, its URGENT lane and a batch on every core
            max_threads=summary["cpu_workers"] + 1 + cores,
        )
    variants = [
        ("trace times, separate hardware", "trace", None, server),
        ("trace times, shared cores", "trace", cores, server),
        ("warm-up solo times, shared cores", "warm-up solo", cores, server),
    ]
    if "solo from the trace" in models:
        variants.append(
            ("solo times from the trace, shared cores", "solo from the trace", cores, server)
        )
        # session 10: each class's noise from its own jobs' ratios (not the default)
        variants.append(
            ("solo from the trace, noise per class", "solo from the trace", cores, server)
        )
    return _recorded(summary) | {
        name: planner_check(
            jobs,
            models[key],
            group,
            scheduler=scheduler,
            cpu_workers=summary["cpu_workers"],
            cores_per_device=shared,
            fillers=fillers,
            noise_per_class=name.endswith("noise per class"),
        )
        for name, key, shared, scheduler in variants
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path, nargs="+")
    parser.add_argument("--cores", type=int, default=None)
    args = parser.parse_args()
    for path in args.summary:
        summary = read_summary(path)
        load = summary["host"]["loadavg_before"][0], summary["host"]["loadavg_after"][0]
        print(f"{path} (seed {summary.get('seed')}, load average {load[0]} -> {load[1]})")
        for name, check in replay(summary, args.cores).items():
            cells = [
                f"{cls:<10} p50 {r['predicted_p50_s']:6.1f}/{r['measured_p50_s']:6.1f} "
                f"({r['diff_p50']:4.0%})  p95 {r['predicted_p95_s']:6.1f}/"
                f"{r['measured_p95_s']:6.1f} ({r['diff_p95']:4.0%})"
                for cls, r in check["classes"].items()
            ]
            within = sum(
                (r["diff_p50"] <= check["goal_rel"]) + (r["diff_p95"] <= check["goal_rel"])
                for r in check["classes"].values()
            )
            print(f"  {name}: {within} of {2 * len(cells)} cells within 25 %")
            for cell in cells:
                print(f"    {cell} (planned/measured)")


if __name__ == "__main__":
    main()
