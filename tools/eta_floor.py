"""The floor the future arrivals set under the ETA error (session 14): per measured job
queued behind >= 3 others in a saved ``radserve bench --scenario eta --json`` run, a
predictor that knows everything present at its submission but not what arrives later.

It is told every present job's share of the wall time as it was really spent until the
job ended (the jobs ahead, the job itself, the running jobs ranked behind, the idle
time: ``tools/eta_decompose.py``'s oracle parts) and its own run's length, the bench's
true arrival process (Poisson, ``MIX`` / ``mean_gap_s`` per class, as
``radserve.bench.eta_trace`` draws it) and each class's shares as spent in the trace.
Later arrivals of a class ranked ahead pass the job by the server's rule
(:func:`radserve.turnaround.eta.overtaking_delay`, within
:func:`~radserve.turnaround.eta.overtaking_window`), each holding it its whole share,
the horizon growing with every one to the fixed point; those ranked with or behind it
that come during its run take wall time beside it (drawn from what such arrivals took
in the trace; the server allows nothing for them). Monte-Carlo draws of the future give
the finish's distribution; the predictor says (a) its mean or (b) the value with the
least expected absolute *relative* error (the median weighted by 1 / turnaround), the
best any predictor of these arrivals can do on average under this model. Beside it:
the rule fed the arrivals that really came, the rule alone (no arrivals beside), and the
server's predicted present work (its walk without arrivals) with the arrivals drawn
(the service-time part of the gap).

    PYTHONPATH=src python tools/eta_floor.py tests/data/eta-traces/*.json.gz [--jobs]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from eta_decompose import first_walks, shares_between, sorted_records, spans

from radserve.bench.eta_accuracy import read_summary
from radserve.bench.eta_trace import MIX
from radserve.turnaround.eta import overtaking_window, walk
from radserve.turnaround.replay import first_seen, shares_of


@dataclass(frozen=True)
class Deep:
    """One measured job behind >= 3 at submission, as the floor's predictor sees it."""

    job_id: str
    cls: int
    now: float
    tat: float
    known: float  # present jobs' shares as spent in [now, end] plus the idle time there
    run: float  # its own start to end (later arrivals ranked behind run beside it then)
    walked: float  # the server's walk without arrivals, seconds from now
    as_run: float  # the server's ETA error at submission (relative, signed)
    until: tuple[float, ...]  # per class rank: an arrival before this clock passes it
    # later arrivals until the job's end: (clock, class, share, share spent in [now, end])
    came: tuple[tuple[float, int, float, float], ...]


@dataclass(frozen=True)
class Stream:
    """The bench's arrival process and each class's shares as spent (its true service)."""

    rates: tuple[float, ...]  # per class rank, arrivals per second
    shares: tuple[np.ndarray, ...]  # per class rank
    # per (deep job's class, arrival's class ranked with or behind it): the wall time a
    # later arrival took beside a deep job, of those that came while it ran (0 if none)
    # and those that came before it started and took some
    beside: Mapping[tuple[int, int], np.ndarray]

    def without_arrivals(self) -> Stream:
        return Stream(tuple(0.0 for _ in self.rates), self.shares, self.beside)


def stream_of(summary: Mapping[str, Any], deep: Sequence[Deep]) -> Stream:
    """The true per-class Poisson rates (the bench's default mix over the recorded mean
    gap), the shares of the stream's jobs (those that arrived before the last measured
    job ended: not the URGENT burst after it), and what the later arrivals ranked with
    or behind the ``deep`` jobs took beside them."""
    records = sorted_records(summary)
    share = shares_of(records, _exclusive(records))
    measured = set(summary["measured_ids"])
    last = max(float(r["at"]) for r in records if r["kind"] == "end" and r["job"] in measured)
    by_class: list[list[float]] = [[] for _ in MIX]
    for job, (cls, at) in first_seen(records).items():
        if job in share and at <= last:
            by_class[cls].append(share[job])
    beside: dict[tuple[int, int], list[float]] = {}
    for d in deep:
        started = d.now + d.tat - d.run
        for at, cls, _, spent in d.came:
            if cls >= d.cls and (at >= started or spent > 0):
                beside.setdefault((d.cls, cls), []).append(spent)
    total = float(sum(MIX))
    return Stream(
        tuple(w / total / float(summary["mean_gap_s"]) for w in MIX),
        tuple(np.asarray(s or [0.0]) for s in by_class),
        {k: np.asarray(v) for k, v in beside.items()},
    )


def _exclusive(records: Sequence[Mapping[str, Any]]) -> bool:
    return bool(next(r for r in records if r["kind"] == "walk")["capacity"]["urgent_exclusive"])


def deep_jobs(summary: Mapping[str, Any]) -> list[Deep]:
    """The measured jobs behind >= 3 at their first walk, with what the floor's
    predictor is told and what really came after."""
    records = sorted_records(summary)
    exclusive = _exclusive(records)
    jobs = spans(records)
    share = shares_of(records, exclusive)
    seen = first_seen(records)
    measured = set(summary["measured_ids"])
    out = []
    for job_id, (now, entries, capacity) in first_walks(records).items():
        index = next(i for i, e in enumerate(entries) if e.job_id == job_id)
        if job_id not in measured or job_id not in jobs or index < 3:
            continue
        cls, start, end = jobs[job_id]
        got, idle = shares_between(jobs, now, end, exclusive)
        present = {e.job_id for e in entries}
        entry = entries[index]
        walked = walk(entries, now, capacity)
        bare = walk(entries, now, dataclasses.replace(capacity, arrivals=()))[index].finish
        out.append(
            Deep(
                job_id,
                cls,
                now,
                end - now,
                sum(s for j, s in got.items() if j in present) + idle,
                end - start,
                bare - now,
                (walked[index].finish - end) / (end - now),
                tuple(
                    now + overtaking_window(entry, k, math.inf, now, capacity)
                    if k < cls
                    else -math.inf
                    for k in range(len(MIX))
                ),
                tuple(
                    sorted(
                        (at, c, share.get(j, 0.0), got.get(j, 0.0))
                        for j, (c, at) in seen.items()
                        if now < at < end and j not in present
                    )
                ),
            )
        )
    return out


def finish_given(deep: Deep, known: float, arrivals: Sequence[tuple[float, int, float]]) -> float:
    """Seconds from submission to the finish when ``arrivals`` (clock, class, hold) come:
    the present work ``known``, then each arrival that comes before the finish so far
    adds its hold (in time order: the fixed point), a class ranked ahead only within
    its window (the server's rule)."""
    finish = deep.now + known
    for at, cls, hold in arrivals:
        if at >= finish:
            break
        if cls >= deep.cls or at < deep.until[cls]:
            finish += hold
    return finish - deep.now


def as_they_came(deep: Deep, beside: bool = True) -> list[tuple[float, int, float]]:
    """The arrivals that really came, each holding its share if ranked ahead, else
    (``beside``) the wall time it took beside the job."""
    return [
        (at, cls, share if cls < deep.cls else spent)
        for at, cls, share, spent in deep.came
        if cls < deep.cls or beside
    ]


def monte_carlo(
    deep: Deep,
    known: float,
    stream: Stream,
    draws: int,
    rng: np.random.Generator,
    beside: bool = True,
) -> np.ndarray:
    """:func:`finish_given` over ``draws`` draws of the future arrivals (Poisson at the
    stream's rates) of the classes ranked ahead, each holding a share drawn from its
    class's shares; with ``beside``, the present work first grows by what the arrivals
    ranked with or behind it during its run take beside it (their count Poisson over
    the run, each a draw of what such arrivals took beside the trace's deep jobs)."""
    start = np.full(draws, known)
    for k, rate in enumerate(stream.rates):
        pool = stream.beside.get((deep.cls, k))
        if beside and k >= deep.cls and rate > 0 and pool is not None:
            counts = rng.poisson(rate * deep.run, draws)
            holds = rng.choice(pool, size=int(counts.sum()))
            start += np.bincount(np.repeat(np.arange(draws), counts), holds, draws)
    classes = [k for k in range(len(stream.rates)) if k < deep.cls and stream.rates[k] > 0]
    rate = sum(stream.rates[k] for k in classes)
    if rate <= 0:
        return start
    until = np.asarray([deep.until[k] - deep.now for k in classes])  # from submission
    p = np.asarray([stream.rates[k] for k in classes]) / rate
    width = 32
    while True:  # enough arrivals that every draw's last one comes after its finish
        at = np.cumsum(rng.exponential(1 / rate, (draws, width)), axis=1)
        which = rng.choice(len(classes), size=(draws, width), p=p)
        hold = np.zeros((draws, width))
        for i, k in enumerate(classes):
            mask = which == i
            hold[mask] = rng.choice(stream.shares[k], size=int(mask.sum()))
        finish = start
        for m in range(width):
            t = at[:, m]
            passes = (t < finish) & (t < until[which[:, m]])
            finish = np.where(passes, finish + hold[:, m], finish)
        if np.all(at[:, -1] >= finish) or width >= 4096:
            return finish
        width *= 2


def weighted_median(durations: np.ndarray) -> float:
    """The prediction that minimises the mean of |prediction - d| / d over the draws d:
    their median weighted by 1 / d."""
    order = np.sort(durations)
    weights = 1.0 / np.maximum(order, 1e-9)
    cumulative = np.cumsum(weights)
    return float(order[np.searchsorted(cumulative, 0.5 * cumulative[-1])])


def floor(summary: Mapping[str, Any], draws: int = 4000, seed: int = 0) -> list[dict[str, Any]]:
    """Per deep job its relative errors (signed): as run; the present work alone; the
    arrivals that came (the server's rule alone, and with the later arrivals beside
    it); the floor's mean and weighted median (the server's rule alone, and with the
    arrivals beside); the same with the server's predicted present work."""
    deep = deep_jobs(summary)
    stream = stream_of(summary, deep)
    rng = np.random.default_rng(seed)
    rows = []
    for d in deep:

        def rel(seconds: float, d: Deep = d) -> float:
            return (seconds - d.tat) / d.tat

        rule = monte_carlo(d, d.known, stream, draws, rng, beside=False)
        told = monte_carlo(d, d.known, stream, draws, rng)
        served = monte_carlo(d, d.walked, stream, draws, rng)
        rows.append(
            {
                "job": d.job_id[:8],
                "cls": d.cls,
                "tat": d.tat,
                "as_run": d.as_run,
                "present_only": rel(d.known),
                "came_rule": rel(finish_given(d, d.known, as_they_came(d, beside=False))),
                "came": rel(finish_given(d, d.known, as_they_came(d))),
                "rule_mean": rel(float(rule.mean())),
                "rule_median": rel(weighted_median(rule)),
                "floor_mean": rel(float(told.mean())),
                "floor_median": rel(weighted_median(told)),
                "server_work_mean": rel(float(served.mean())),
                "server_work_median": rel(weighted_median(served)),
            }
        )
    return rows


COLUMNS = (
    "as_run",
    "present_only",
    "came_rule",
    "came",
    "rule_mean",
    "rule_median",
    "floor_mean",
    "floor_median",
    "server_work_mean",
    "server_work_median",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", type=Path, nargs="+")
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", action="store_true", help="every deep job's errors too")
    args = parser.parse_args()
    print(f"{'trace':34} {'n':>3} " + " ".join(f"{c:>18}" for c in COLUMNS))
    for path in args.summaries:
        rows = floor(read_summary(path), args.draws, args.seed)
        if not rows:
            continue
        cells = []
        for c in COLUMNS:
            errs = [r[c] for r in rows]
            cells.append(
                f"{statistics.median(abs(e) for e in errs):6.1%} ({statistics.median(errs):+6.1%})"
            )
        name = path.name.removeprefix("eta-").removesuffix(".json.gz")
        print(f"{name:34} {len(rows):3} " + " ".join(f"{c:>18}" for c in cells))
        if args.jobs:
            for r in rows:
                print(
                    "   ",
                    " ".join(
                        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()
                    ),
                )


if __name__ == "__main__":
    main()
