"""Replay the planner check of a saved ``radserve bench --scenario eta --json`` run with
the simulation in this tree: the same arrivals and classes, against the run's measured
per-class p50/p95 TAT, under several models of the host
(:data:`radserve.bench.eta_planner.MODELS`). Lets a change to the host model or to the
service times drawn be judged on a trace already measured, without running the server
again. The checks the bench itself made when it ran (``planner``,
``planner_separate_hardware``, ``planner_shared_cores``, ``planner_host_model``: the code
of that commit) are printed first.

    PYTHONPATH=src python tools/eta_planner_replay.py out/eta.json [more.json ...] [--cores N]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import read_summary
from radserve.bench.eta_planner import cells_within, replay_planner

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path, nargs="+")
    parser.add_argument("--cores", type=int, default=None)
    args = parser.parse_args()
    for path in args.summary:
        summary = read_summary(path)
        load = summary["host"]["loadavg_before"][0], summary["host"]["loadavg_after"][0]
        print(f"{path} (seed {summary.get('seed')}, load average {load[0]} -> {load[1]})")
        checks = _recorded(summary) | replay_planner(summary, args.cores)
        for name, check in checks.items():
            within, cells = cells_within(check)
            print(f"  {name}: {within} of {cells} cells within 25 %")
            for cls, r in check["classes"].items():
                print(
                    f"    {cls:<10} p50 {r['predicted_p50_s']:6.1f}/{r['measured_p50_s']:6.1f} "
                    f"({r['diff_p50']:4.0%})  p95 {r['predicted_p95_s']:6.1f}/"
                    f"{r['measured_p95_s']:6.1f} ({r['diff_p95']:4.0%}) (planned/measured)"
                )


if __name__ == "__main__":
    main()
