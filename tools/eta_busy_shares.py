"""Replay the ETAs of saved ``radserve bench --scenario eta --json`` runs with every
share of wall time learned as at most a busy server's: ``min(share, CPU s / cores +
device s)`` of the job's own stage times (a job alone leaves cores idle in its
single-threaded CPU stages, which a busy server fills; its share is then its whole run,
~2x a busy server's on the loaded traces). Tried on 2026-12-02 (session 12) against the
loaded-host ETA error and not adopted: it helped the two loaded traces and made the
quiet ones' halfway and all-jobs errors worse (docs/history/turnaround.md). Both rows
refit the service-time model from the recording's start and ends (lanes exclusive,
shares), the server's defaults; the first reproduces the server as run.

    PYTHONPATH=src python tools/eta_busy_shares.py tests/data/eta-traces/*.json.gz
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import arrivals_before, read_summary
from radserve.turnaround.rates import ArrivalRates
from radserve.turnaround.replay import Refit, Variant, errors, replay
from radserve.turnaround.service_time import DEVICE_SUFFIX, NOT_WORK, RUN, SHARE

SERVER = Variant(
    drain=False,
    capacity=(("share_left", "measured"), ("running_behind", False)),
    rates=ArrivalRates(),
    refit=Refit(lanes="exclusive", shares=True),
)


def busy(timings: Mapping[str, float], share: float, cores: int) -> float:
    """``share`` at most the job's CPU stages spread over ``cores`` plus its batches."""
    work = {k: v for k, v in timings.items() if k not in NOT_WORK}
    work = {k: v for k, v in work.items() if not k.startswith((RUN, SHARE))}
    device = sum(v for k, v in work.items() if k.endswith(DEVICE_SUFFIX))
    return min(share, (sum(work.values()) - device) / cores + device)


def busy_summary(summary: Mapping[str, Any], cores: int) -> dict[str, Any]:
    """``summary`` with every recorded share, and the starting model's, made busy."""
    out = copy.deepcopy(dict(summary))
    for r in out["eta_records"]:
        if r["kind"] == "end" and r.get("share") is not None and "timings" in r:
            r["share"] = busy(r["timings"], r["share"], cores)
    rows = out["service_times_at_start"]["samples"]
    for row in rows:
        if row["step"].startswith(SHARE):
            n = len(row["seconds"])
            same = [s for s in rows if len(s["seconds"]) == n]  # the jobs' other steps
            for i in range(n):
                timings = {s["step"]: s["seconds"][i] for s in same}
                row["seconds"][i] = busy(timings, row["seconds"][i], cores)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", type=Path, nargs="+")
    args = parser.parse_args()
    for path in args.summaries:
        summary = read_summary(path)
        cores = summary["host"]["usable_cores"]
        for name, data in (("as run", summary), ("busy shares", busy_summary(summary, cores))):
            got = errors(
                replay(
                    data["eta_records"],
                    SERVER,
                    data["service_times_at_start"],
                    arrivals_before(data),
                ),
                set(data["measured_ids"]),
            )
            deep, every = got["behind_3"], got["all"]
            print(
                f"{path.name:30} {name:12} behind>=3 ({deep['jobs']}) at submission "
                f"{deep['submission']['median_rel']:.1%} "
                f"({deep['submission']['median_signed_rel']:+.1%}), halfway "
                f"{deep['halfway']['median_rel']:.1%}; all at submission "
                f"{every['submission']['median_rel']:.1%}"
            )


if __name__ == "__main__":
    main()
