"""Replay the planner check of a saved ``radserve bench --scenario eta --json`` run with
the simulation in this tree: the same arrivals and classes, the service times the run
learned (``service_times``, and the warm-up studies' solo times ``service_times_solo``),
against the run's measured per-class p50/p95 TAT. Lets a change to the host model be
judged on a trace already measured, without running the server again.

    PYTHONPATH=src python tools/eta_planner_replay.py out/eta.json [--cores N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import JobTrace, group_of, planner_check
from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.turnaround.eta import on_host_cores
from radserve.turnaround.service_time import ServiceTimeModel


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
    if cores is None and on_host_cores(summary["device"]):
        cores = summary["host"]["usable_cores"]
    out = {}
    for name, key, shared in (
        ("default (separate hardware, trace times)", "service_times", None),
        ("shared cores, trace times", "service_times", cores),
        ("shared cores, solo times", "service_times_solo", cores),
    ):
        model = ServiceTimeModel.from_json(summary[key])
        group = group_of(model, summary["pipeline"], "fp32")
        out[name] = planner_check(
            jobs,
            model,
            group,
            scheduler=SchedulerSettings(),
            cpu_workers=summary["cpu_workers"],
            cores_per_device=shared,
            fillers=fillers,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path)
    parser.add_argument("--cores", type=int, default=None)
    args = parser.parse_args()
    result = replay(json.loads(args.summary.read_text()), args.cores)
    for name, check in result.items():
        cells = [
            f"{cls} p50 {r['predicted_p50_s']:.1f}/{r['measured_p50_s']:.1f} ({r['diff_p50']:.0%}) "
            f"p95 {r['predicted_p95_s']:.1f}/{r['measured_p95_s']:.1f} ({r['diff_p95']:.0%})"
            for cls, r in check["classes"].items()
        ]
        within = sum(
            (r["diff_p50"] <= check["goal_rel"]) + (r["diff_p95"] <= check["goal_rel"])
            for r in check["classes"].values()
        )
        print(f"{name}: {within} of {2 * len(cells)} cells within 25 %")
        for cell in cells:
            print(f"  {cell} (planned/measured)")


if __name__ == "__main__":
    main()
