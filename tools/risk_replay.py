"""Replay the deadline-risk alerts over saved ``radserve bench --scenario eta --json`` runs
(session 20, issue 17): the server's walk (``radserve.turnaround.replay.SERVER_WALK``)
over every recorded snapshot, each ended job's predicted finishes fed to the server's
:class:`radserve.turnaround.risk.RiskTracker` under a rule. Per trace and overall:
misses, misses a risk stood for at the deadline and how early it was raised (median,
min), alerts for jobs that did not miss (false) and how many of those ended within 5,
10, 15, 30 s of the deadline (near misses, fair warnings), raise events per job; the
false alerts classified (class, raised at submission, cold start, raised more than
once, predicted to make the deadline itself, ended inside the margin as predicted, gone
without the allowance for later URGENT arrivals); then every rule of a grid (margin,
a margin growing with the time left, persistence) chosen on one half of the traces
(seed 0) and scored on the other, and the other way round.

    PYTHONPATH=src python tools/risk_replay.py tests/data/eta-traces/*.json.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import arrivals_before, read_summary
from radserve.turnaround.eta import URGENT
from radserve.turnaround.replay import (
    SERVER_MARGIN_S,
    SERVER_WALK,
    Replayed,
    RiskRule,
    deadline_alerts,
    replay,
    risk_outcomes,
)

NEAR_S = (5.0, 10.0, 15.0, 30.0)  # a false alert for a job that ended this close: fair
SESSION_19 = RiskRule(margin_s=30.0, clear_s=15.0)  # the server's rule before session 20
MIN_LEAD_S = 10.0  # a rule must raise every tuning miss at least this early
COLD_JOBS = 10  # a raise with fewer jobs ended before it is a cold-start one
GRID = [
    RiskRule(margin, 15.0, fraction, hold)
    for margin in (0.0, 5.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0)
    for fraction in (0.0, 0.1, 0.2)
    for hold in (0.0, 2.0, 5.0, 10.0)
]


def replayed(path: Path, allowance: bool = True) -> list[Replayed]:
    """A trace's jobs under the server's walk (with or without the allowance)."""
    summary = read_summary(path)
    variant = dataclasses.replace(SERVER_WALK, allowance=allowance)
    return replay(
        summary["eta_records"], variant, summary["service_times_at_start"], arrivals_before(summary)
    )


def summed(alerts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Several traces' :func:`deadline_alerts` as one."""
    out: dict[str, Any] = {"jobs": 0, "misses": 0, "predicted": 0, "false_alerts": 0}
    out |= {"raised": 0, "lead_s": [], "false_slack_s": []}
    for a in alerts:
        for key in out:
            out[key] += a[key]
    return out


def line(a: Mapping[str, Any]) -> str:
    lead = a["lead_s"]
    near = ", ".join(f"{sum(s <= x for s in a['false_slack_s'])} within {x:.0f} s" for x in NEAR_S)
    lead_text = (
        f"lead median {statistics.median(lead):.1f} s, min {min(lead):.1f} s" if lead else "no lead"
    )
    return (
        f"misses {a['misses']:2}, predicted {a['predicted']:2} ({lead_text}); false alerts "
        f"{a['false_alerts']:3} ({near}); {a['raised'] / max(1, a['jobs']):.3f} alerts per job "
        f"({a['raised']} over {a['jobs']} jobs)"
    )


def classify(jobs: Sequence[Replayed], bare: Sequence[Replayed], rule: RiskRule) -> dict[str, int]:
    """Why ``rule``'s false alerts were raised (``bare``: the same trace replayed without
    the allowance for later arrivals; counts overlap)."""
    ends = sorted(j.end for j in jobs if j.end is not None and j.state == "succeeded")
    without = {o.job.job_id for o in risk_outcomes(bare, rule) if o.raised_at}
    out = {
        "false": 0,
        "urgent": 0,
        "at_submission": 0,
        "cold_start": 0,
        "raised_twice": 0,
        "predicted_on_time": 0,
        "ended_in_margin": 0,
        "not_without_allowance": 0,
    }
    for o in risk_outcomes(jobs, rule):
        if not o.raised_at or o.missed or o.job.end is None:
            continue
        job, first = o.job, o.raised_at[0]
        finish = dict(job.readings)[first]
        out["false"] += 1
        out["urgent"] += job.cls == URGENT
        out["at_submission"] += first == job.arrival
        out["cold_start"] += sum(e <= first for e in ends) < COLD_JOBS
        out["raised_twice"] += len(o.raised_at) > 1
        out["predicted_on_time"] += finish <= job.deadline
        out["ended_in_margin"] += job.end > job.deadline - rule.margin_s
        out["not_without_allowance"] += job.job_id not in without
    return out


def score(traces: Mapping[str, list[Replayed]], names: Iterable[str], rule: RiskRule) -> dict:
    return summed(deadline_alerts(traces[n], rule) for n in names)


def choose(traces: Mapping[str, list[Replayed]], names: Sequence[str]) -> RiskRule:
    """The grid's rule that raises every miss of ``names`` at least ``MIN_LEAD_S`` ahead
    with the fewest false alerts (ties: the fewest options, then the longest median lead)."""

    def key(rule: RiskRule) -> tuple[float, ...]:
        a = score(traces, names, rule)
        ok = a["predicted"] == a["misses"] and min(a["lead_s"], default=0.0) >= MIN_LEAD_S
        options = (rule.margin_fraction > 0) + (rule.hold_s > 0)
        lead = statistics.median(a["lead_s"]) if a["lead_s"] else 0.0
        return (not ok, a["false_alerts"], options, -lead)

    return min(GRID, key=key)


def describe(rule: RiskRule) -> str:
    return (
        f"margin {rule.margin_s:g} s + {rule.margin_fraction:g} of the time left, "
        f"hold {rule.hold_s:g} s, clear {rule.clear_s:g} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", type=Path, nargs="+")
    parser.add_argument("--no-grid", action="store_true", help="the two server rules only")
    args = parser.parse_args()
    traces = {p.name: replayed(p) for p in args.summaries}
    bare = {p.name: replayed(p, allowance=False) for p in args.summaries}
    server = RiskRule()
    for title, rule in (("session 19", SESSION_19), (f"server ({SERVER_MARGIN_S:g} s)", server)):
        print(f"== {title}: {describe(rule)}")
        for name, jobs in traces.items():
            print(f"{name:36} {line(deadline_alerts(jobs, rule))}")
        print(f"{'all':36} {line(score(traces, traces, rule))}")
        why: dict[str, int] = {}
        for name, jobs in traces.items():
            for k, v in classify(jobs, bare[name], rule).items():
                why[k] = why.get(k, 0) + v
        print(f"{'false alerts, why':36} {why}")
    if args.no_grid:
        return
    seed0 = [n for n in traces if "-s0" in n]
    rest = [n for n in traces if n not in seed0]
    for tune, held in ((seed0, rest), (rest, seed0)):
        rule = choose(traces, tune)
        print(f"== chosen on {len(tune)} traces: {describe(rule)}")
        print(f"{'  tuning':36} {line(score(traces, tune, rule))}")
        print(f"{'  held out':36} {line(score(traces, held, rule))}")
        for other in (SESSION_19, server):
            print(f"{'  held out, ' + describe(other)[:24]:36} {line(score(traces, held, other))}")
    print("== every rule of the grid, all traces")
    for rule in GRID:
        print(f"{describe(rule):56} {line(score(traces, traces, rule))}")


if __name__ == "__main__":
    main()
