"""Why each ETA was early or late: per measured job of a saved ``radserve bench
--scenario eta --json`` run, the server's wall time between its submission and its end
split by who had it, against what the walk predicted for each part.

Over any stretch the shares of wall time (:mod:`radserve.turnaround.share`: split
equally among the running jobs, among the URGENT ones alone while they run) add up to
the stretch, so a job's turnaround is exactly the shares spent in it by the jobs ranked
ahead of it at submission, by itself, by later arrivals that overtook it, by jobs ranked
behind it that ran beside it, plus idle time. The walk predicts the first three: the
shares of the jobs ahead (a running job: the part of its latency left) and its own
(:func:`radserve.turnaround.eta.walk`), bounded below by its own latency chain through
the routine slots, plus the allowance for overtaking arrivals
(:func:`radserve.turnaround.eta.overtaking_delay`).

``--parts`` sums each part's error over the jobs (session 15): predicted less spent, as
a fraction of their turnaround (< 0: the part made the ETA early); the parts add up to
each job's error.

    PYTHONPATH=src python tools/eta_decompose.py out/eta.json [--all] [--oracle] [--by-class]
        [--parts]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import read_summary
from radserve.turnaround.eta import URGENT, Capacity, Entry, walk
from radserve.turnaround.replay import SharesSoFar, shares_of, walk_inputs

CLASS = {0: "U", 1: "I", 2: "O"}


def spans(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, float, float]]:
    """Every job's (class, start, end) in the scheduler's clock: a succeeded job's start
    from its end record's ``run`` timing, else the first walk that saw it running."""
    classes: dict[str, int] = {}
    started: dict[str, float] = {}
    for r in records:
        if r["kind"] == "walk":
            for row in r["entries"]:
                classes.setdefault(str(row[0]), int(row[1]))
                if row[2] and row[4] is not None:
                    started.setdefault(str(row[0]), float(row[4]))
    out = {}
    for r in records:
        if r["kind"] != "end":
            continue
        job, at = str(r["job"]), float(r["at"])
        run = (r.get("timings") or {}).get("run")
        start = at - float(run) if run is not None else started.get(job)
        if start is not None and job in classes:
            out[job] = (classes[job], start, at)
    return out


def shares_between(
    jobs: Mapping[str, tuple[int, float, float]], lo: float, hi: float, urgent_holds: bool
) -> tuple[dict[str, float], float]:
    """Each job's share of the wall time in [lo, hi], and the idle time there."""
    cuts = sorted({lo, hi, *(t for _, s, e in jobs.values() for t in (s, e) if lo < t < hi)})
    got: dict[str, float] = {}
    idle = 0.0
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        running = [j for j, (_, s, e) in jobs.items() if s < mid < e]
        urgent = [j for j in running if jobs[j][0] == URGENT]
        sharing = urgent if (urgent and urgent_holds) else running
        if not sharing:
            idle += b - a
            continue
        for j in sharing:
            got[j] = got.get(j, 0.0) + (b - a) / len(sharing)
    return got, idle


def first_walks(
    records: Sequence[Mapping[str, Any]],
) -> dict[str, tuple[float, list[Entry], Capacity]]:
    """Each job's first walk (its ETA at submission): the clock, the entries with their
    shares so far, the capacity; in the order the jobs were first seen."""
    walked: dict[str, tuple[float, list[Entry], Capacity]] = {}
    walks = [r for r in records if r["kind"] == "walk"]
    so_far = SharesSoFar(records, bool(walks[0]["capacity"]["urgent_exclusive"]))
    for r in walks:
        now, entries, capacity = walk_inputs(r)
        entries = so_far.fill(entries, now)
        for row in r["entries"]:
            walked.setdefault(str(row[0]), (now, entries, capacity))
    return walked


def sorted_records(summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The recorded walks and ends in clock order, an end before a walk at its instant."""
    return sorted(summary["eta_records"], key=lambda r: (r["at"], r["kind"] != "end"))


def decompose(
    summary: Mapping[str, Any], all_jobs: bool = False, options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    records = sorted_records(summary)
    measured = set(summary["measured_ids"])
    jobs = spans(records)
    walked = first_walks(records)
    t0 = min(float(r["at"]) for r in records)
    out = []
    for job_id, (now, entries, capacity) in walked.items():
        if job_id not in measured or job_id not in jobs:
            continue
        cls, _, end = jobs[job_id]
        capacity = dataclasses.replace(capacity, **dict(options or {}))
        index = next(i for i, e in enumerate(entries) if e.job_id == job_id)
        if index < 3 and not all_jobs:
            continue
        eta = walk(entries, now, capacity)[index]
        bare = walk(entries, now, dataclasses.replace(capacity, arrivals=()))[index]
        ahead = {e.job_id for e in entries[:index]}
        behind = {e.job_id for e in entries[index + 1 :]}
        pred_ahead = 0.0
        for e in entries[:index]:
            share = e.estimate.share_s if e.estimate.share_s is not None else 0.0
            if e.running and capacity.share_left == "measured" and e.share_so_far is not None:
                share = max(share - e.share_so_far, 0.05 * share)
            elif e.running:
                left = max(
                    e.estimate.latency_s - (now - (e.started or now)), 0.05 * e.estimate.latency_s
                )
                share *= left / max(e.estimate.latency_s, 1e-9)
            pred_ahead += share
        own = entries[index].estimate
        got, idle = shares_between(jobs, now, end, bool(capacity.urgent_exclusive))
        over = {j: s for j, s in got.items() if j not in ahead and j not in behind and j != job_id}
        overtook = sum(s for j, s in over.items() if jobs[j][0] < cls)
        later_behind = sum(s for j, s in over.items() if jobs[j][0] >= cls)
        tat = end - now
        out.append(
            {
                "job": job_id[:8],
                "cls": CLASS.get(cls, str(cls)),
                "t": round(now - t0, 1),
                "pos": index,
                "tat": round(tat, 1),
                "err": round((eta.finish - end) / tat, 3),
                "pred_ahead": round(pred_ahead, 1),
                "act_ahead": round(sum(got.get(j, 0.0) for j in ahead), 1),
                "pred_own": round(own.share_s or 0.0, 1),
                "act_own": round(got.get(job_id, 0.0), 1),
                "lat": round(own.latency_s, 1),
                "walk": round(bare.finish - now, 1),
                "pred_over": round(eta.finish - bare.finish, 1),
                "act_over": round(overtook, 1),
                "n_over": sum(1 for j in over if jobs[j][0] < cls),
                "behind_ran": round(sum(got.get(j, 0.0) for j in behind) + later_behind, 1),
                "idle": round(idle, 1),
                "rates": [round(a.rate_per_s * 60, 2) for a in capacity.arrivals if a.cls < cls],
            }
        )
    return out


# each part's error of one job in seconds, predicted less spent (session 15): they add up
# to the ETA's error, ``err`` x ``tat`` (the walk is the shares ahead, the job's own, and
# what its latency chain through the routine slots adds over them; nothing is predicted
# for the jobs ranked behind it that ran beside it, nor for idle time)
PARTS: dict[str, Callable[[Mapping[str, Any]], float]] = {
    "ahead": lambda r: r["pred_ahead"] - r["act_ahead"],
    "own": lambda r: r["pred_own"] - r["act_own"],
    "latency bound": lambda r: r["walk"] - r["pred_ahead"] - r["pred_own"],
    "overtaking": lambda r: r["pred_over"] - r["act_over"],
    "behind": lambda r: -r["behind_ran"],
    "idle": lambda r: -r["idle"],
}


def part_errors(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per part (:data:`PARTS`): its error summed over ``rows`` over their summed
    turnaround, and the median of each job's part error over its turnaround."""
    total = sum(r["tat"] for r in rows)
    return {
        name: (
            sum(part(r) for r in rows) / total,
            statistics.median(part(r) / r["tat"] for r in rows),
        )
        for name, part in PARTS.items()
    }


def oracle(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Median |error| with a predicted part replaced by what it really took (session 13:
    which part's misprediction the error is made of): the overtaking arrivals, the jobs
    ahead, both, and also the job's own share and the running jobs ranked behind; the
    arrivals allowed for (rate x the predicted horizon) and those that came, and the
    mean hold of each."""

    def median_abs(errs: Iterable[float]) -> float:
        return statistics.median(abs(e) for e in errs)

    def err(r: Mapping[str, Any], ahead: bool, over: bool, rest: bool = False) -> float:
        got = r["walk"] + (r["act_over"] if over else r["pred_over"])
        if ahead:
            got += r["act_ahead"] - r["pred_ahead"]
        if rest:
            got += r["act_own"] - r["pred_own"] + r["behind_ran"]
        return (got - r["tat"]) / r["tat"]

    allowed = sum(sum(r["rates"]) / 60 * (r["walk"] + r["pred_over"]) for r in rows)
    came = sum(r["n_over"] for r in rows)
    return {
        "as_run": median_abs(r["err"] for r in rows),
        "overtaking_as_spent": median_abs(err(r, False, True) for r in rows),
        "ahead_as_spent": median_abs(err(r, True, False) for r in rows),
        "both": median_abs(err(r, True, True) for r in rows),
        "both_bias": statistics.median(err(r, True, True) for r in rows),
        "all_parts": median_abs(err(r, True, True, True) for r in rows),
        "arrivals_allowed": allowed,
        "arrivals_came": came,
        "hold_allowed_s": sum(r["pred_over"] for r in rows) / max(allowed, 1e-9),
        "hold_came_s": sum(r["act_over"] for r in rows) / max(came, 1),
    }


def offered_load(summary: Mapping[str, Any]) -> tuple[float, float]:
    """The load the measured stream offered, sum over classes of (arrivals per second
    between the first and the last measured arrival) x (the class's mean measured share
    of wall time): above 1 the queue grows; and the measured jobs' mean share over the
    warm-up study's run alone (the bench's ``--load`` yardstick)."""
    records = sorted_records(summary)
    walks = [r for r in records if r["kind"] == "walk"]
    shares = shares_of(records, bool(walks[0]["capacity"]["urgent_exclusive"]))
    first: dict[str, tuple[float, int]] = {}
    for r in walks:
        for row in r["entries"]:
            first.setdefault(str(row[0]), (float(r["at"]), int(row[1])))
    measured = [j for j in summary["measured_ids"] if j in first and j in shares]
    lo = min(first[j][0] for j in measured)
    hi = max(first[j][0] for j in measured)
    load = 0.0
    for cls in {first[j][1] for j in measured}:
        arrived = sum(1 for at, c in first.values() if c == cls and lo <= at <= hi)
        mean = statistics.mean(shares[j] for j in measured if first[j][1] == cls)
        load += arrived / max(hi - lo, 1e-9) * mean
    mean_share = statistics.mean(shares[j] for j in measured)
    return load, mean_share / float(summary["warmup_service_s"])


def ahead_by_class(summary: Mapping[str, Any]) -> dict[tuple[int, bool], tuple[int, float, float]]:
    """Per class of a job ranked ahead of a measured job behind >= 3 at its submission,
    and whether it was running: (times seen, mean share predicted, mean share it really
    took from then on). A share is learned pooled over the routine classes, but under
    priority an OUTPATIENT job running beside INPATIENT work is charged wall time it
    waits through (session 13)."""
    records = sorted_records(summary)
    measured = set(summary["measured_ids"])
    walks = [r for r in records if r["kind"] == "walk"]
    exclusive = bool(walks[0]["capacity"]["urgent_exclusive"])
    total = shares_of(records, exclusive)
    so_far = SharesSoFar(records, exclusive)
    seen: set[str] = set()
    sums: dict[tuple[int, bool], list[float]] = {}
    for r in walks:
        now, entries, _ = walk_inputs(r)
        entries = so_far.fill(entries, now)
        for index, e in enumerate(entries):
            if e.job_id in seen:
                continue
            seen.add(e.job_id)
            if e.job_id not in measured or index < 3:
                continue
            for a in entries[:index]:
                share = a.estimate.share_s
                if a.job_id not in total or share is None:
                    continue
                had = (a.share_so_far or 0.0) if a.running else 0.0
                row = sums.setdefault((a.cls, a.running), [0, 0.0, 0.0])
                row[0] += 1
                row[1] += max(share - had, 0.05 * share)
                row[2] += total[a.job_id] - had
    return {k: (int(n), p / n, s / n) for k, (n, p, s) in sorted(sums.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", type=Path, nargs="+")
    parser.add_argument("--all", action="store_true", help="every measured job, not behind >= 3")
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="also the median error with each predicted part replaced by what it took",
    )
    parser.add_argument(
        "--by-class", action="store_true", help="also the jobs ahead's shares per class"
    )
    parser.add_argument(
        "--parts", action="store_true", help="also each part's error summed over the jobs"
    )
    parser.add_argument(
        "--set", action="append", default=[], help="a walk option, e.g. share_left=measured"
    )
    args = parser.parse_args()
    options: dict[str, Any] = {}
    for item in args.set:
        name, value = item.split("=", 1)
        options[name] = {"true": True, "false": False}.get(value.lower(), value)
    for path in args.summaries:
        summary = read_summary(path)
        rows = decompose(summary, args.all, options)
        print(path.name)
        if not rows:
            continue
        keys = list(rows[0])
        print("  " + " ".join(f"{k:>10}" for k in keys))
        for row in sorted(rows, key=lambda r: r["t"]):
            print("  " + " ".join(f"{row[k]!s:>10}" for k in keys))
        errs = [abs(r["err"]) for r in rows]
        print(f"  median |err| {statistics.median(errs):.1%} over {len(rows)} jobs")
        if args.oracle:
            o = oracle(rows)
            print(
                f"  with overtaking as spent {o['overtaking_as_spent']:.1%}, ahead as spent "
                f"{o['ahead_as_spent']:.1%}, both {o['both']:.1%} (bias {o['both_bias']:+.1%}),"
                f" also own and behind {o['all_parts']:.1%}; arrivals allowed for "
                f"{o['arrivals_allowed']:.0f}, came {o['arrivals_came']}, hold "
                f"{o['hold_allowed_s']:.2f} / {o['hold_came_s']:.2f} s"
            )
        if args.oracle:
            load, ratio = offered_load(summary)
            print(f"  offered load {load:.2f}; mean share / warm-up study {ratio:.2f}")
        if args.parts:
            print(
                "  parts, predicted - spent over TAT (sum / median per job): "
                + ", ".join(
                    f"{name} {total:+.1%} / {median:+.1%}"
                    for name, (total, median) in part_errors(rows).items()
                )
            )
        if args.by_class:
            for (cls, running), (n, pred, spent) in ahead_by_class(summary).items():
                state = "running" if running else "queued"
                print(
                    f"  ahead {CLASS.get(cls, cls)} {state:7} x{n:3}: share {pred:.2f} s "
                    f"predicted, {spent:.2f} s spent ({spent / pred:.2f}x)"
                )


if __name__ == "__main__":
    main()
