"""Is the server draining its queue? Session 39: direct server-side signals that could
choose the overtaking window of session 37 (cut at the job's predicted start plus its
run while the server drains, the whole horizon while it does not), replayed on saved
``radserve bench --scenario eta --json`` runs.

Session 37 found that counting the later arrivals of routine classes ranked ahead only
until a job's predicted start plus its run mends the sustainable-load runs (``--load
1.0``, offered load 0.80-0.90) and breaks the overloaded ones, and that the counted load
cannot tell the two apart. The signals tried here, each from what the server sees at a
walk (its entries: queued and running, their estimates, their starts):

- ``busy``: the fraction of the last ``window_s`` with a routine job queued (every slot
  it may use taken);
- ``wait``: the median wait (start - submission) over the run time of the routine jobs
  that started in the last ``window_s`` (``include_queued``: with the waits so far of
  those still queued);
- ``trend``: the least-squares slope of the count of queued routine jobs over the last
  ``window_s`` (jobs per second); ``btrend``: of the backlog, the walk's remaining work
  (shares of the queued jobs, shares left of the running ones; seconds per second);
- ``load``: the counted load (the allowance's rates times the classes' shares);
- ``always``: cut at every walk (session 37's variant); ``regime`` (not a signal): cut
  on the ``--load 1.0`` runs only, as if the regime were known.

A signal at or below ``lo`` cuts the window, above ``hi`` keeps the whole horizon,
between them blends the two windows linearly. The window's cut and the signal live in
this tool only (``overtaking_window`` and the replay's ``walk`` are patched while it
runs); the server is unchanged.

    PYTHONPATH=src python tools/eta_drain_signals.py tests/data/eta-traces/*.json.gz
    PYTHONPATH=src python tools/eta_drain_signals.py --signals tests/data/eta-traces/*.json.gz
    PYTHONPATH=src python tools/eta_drain_signals.py --grid tests/data/eta-traces/*.json.gz
    PYTHONPATH=src python tools/eta_drain_signals.py --bands tests/data/eta-traces/*.json.gz

The first prints the representative variants of session 39 (median over the runs behind
>= 3 at submission, runs at or under 20 %, worst run, halfway median, the seed halves, the
``--load 1.0`` runs and the rest, deadline misses predicted ahead and false alerts);
``--signals`` each signal's value per run over the first and second half of the stream
and at the deep jobs' submissions; ``--grid`` every threshold, and the one each half of
the runs would choose, scored on the other half; ``--bands`` the deep jobs pooled by
when in the stream they were submitted, under the server's walk and cut at every walk.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import re
import statistics
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from radserve.bench.eta_accuracy import arrivals_before, read_summary
from radserve.turnaround import eta
from radserve.turnaround import replay as replay_module
from radserve.turnaround.eta import URGENT, Capacity, Entry, Eta
from radserve.turnaround.replay import SERVER_WALK, Replayed, deadline_alerts, errors, replay

GOAL = 0.20
DEEP_EARLY_S = 15.0  # the lead-in and burst: where the window's choice matters


@dataclasses.dataclass
class DrainSignal:
    """One signal of whether the server drains its queue, fed every walk in order."""

    kind: str = "btrend"
    window_s: float = 60.0
    lo: float = 0.2
    hi: float = 0.2
    include_queued: bool = False
    _points: deque[tuple[float, bool, float, float]] = dataclasses.field(default_factory=deque)
    _arrived: dict[str, float] = dataclasses.field(default_factory=dict)
    _started: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    _waiting: list[float] = dataclasses.field(default_factory=list)
    _load: float = 0.0

    def observe(self, now: float, entries: Sequence[Entry], capacity: Capacity) -> None:
        self._load = sum(a.rate_per_s * capacity.through_s(a.estimate) for a in capacity.arrivals)
        queued, backlog, self._waiting = 0, 0.0, []
        for e in entries:
            arrived = self._arrived.setdefault(e.job_id, now)
            share = e.estimate.share_s if e.estimate.share_s is not None else e.estimate.latency_s
            if e.running:
                backlog += max(share - (e.share_so_far or 0.0), 0.05 * share)
            else:
                backlog += share
            if e.cls == URGENT:
                continue
            latency = max(e.estimate.latency_s, 1e-9)
            if e.running and e.started is not None and e.job_id not in self._started:
                self._started[e.job_id] = (e.started, max(0.0, e.started - arrived) / latency)
            if not e.running:
                queued += 1
                self._waiting.append((now - arrived) / latency)
        self._points.append((now, queued > 0, float(queued), backlog))
        while len(self._points) > 2 and self._points[1][0] < now - self.window_s:
            self._points.popleft()

    def value(self, now: float) -> float | None:
        points = list(self._points)
        if self.kind == "load":
            return self._load
        if self.kind == "busy":
            start, busy, total = now - self.window_s, 0.0, 0.0
            for (a, waiting, _, _), (b, *_rest) in zip(points, [*points[1:], (now,)], strict=True):
                span = min(b, now) - max(a, start)
                if span > 0:
                    total += span
                    busy += span if waiting else 0.0
            return busy / total if total > 0 else None
        if self.kind == "wait":
            waits = [w for at, w in self._started.values() if at >= now - self.window_s]
            waits += self._waiting if self.include_queued else []
            return statistics.median(waits) if waits else 0.0
        if self.kind in ("trend", "btrend"):
            inside = [p for p in points if p[0] >= now - self.window_s]
            if len(inside) < 3:
                return None
            xs = [p[0] for p in inside]
            ys = [p[2] if self.kind == "trend" else p[3] for p in inside]
            mx, my = statistics.mean(xs), statistics.mean(ys)
            vx = sum((x - mx) ** 2 for x in xs)
            return (
                sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / vx if vx else None
            )
        raise ValueError(f"unknown signal {self.kind!r}")

    def weight(self, now: float) -> float:
        """1: cut the window; 0: the whole horizon (also before the signal has a value)."""
        if self.kind == "always":
            return 1.0
        got = self.value(now)
        if got is None or got > self.hi:
            return 0.0
        if got <= self.lo:
            return 1.0
        return (self.hi - got) / (self.hi - self.lo)


_SERVER_WINDOW = eta.overtaking_window
_SERVER_WALK = eta.walk


@contextlib.contextmanager
def cut_by(signal: DrainSignal | None) -> Iterator[None]:
    """While inside, the replay's walks cut the routine classes' overtaking window at
    each job's predicted start plus its run (moved by the delay found so far, as
    session 37's variant), weighted by ``signal`` (None: the server's walk)."""
    state: dict[str, Any] = {"weight": 0.0, "ends": {}, "first": {}}

    def window(entry: Entry, ahead: int, horizon: float, now: float, capacity: Capacity) -> float:
        whole = _SERVER_WINDOW(entry, ahead, horizon, now, capacity)
        end = state["ends"].get(entry.job_id)
        if ahead == URGENT or end is None or state["weight"] <= 0:
            return whole
        first = state["first"].setdefault(entry.job_id, horizon)  # step one: no delay yet
        cut = min(whole, max(0.0, end + horizon - first))
        return (1 - state["weight"]) * whole + state["weight"] * cut

    def walk(entries: Sequence[Entry], now: float, capacity: Capacity) -> list[Eta]:
        assert signal is not None
        signal.observe(now, entries, capacity)
        state["weight"], state["first"] = signal.weight(now), {}
        # the walk's starts do not depend on the allowance: one walk to read them
        plain = _SERVER_WALK(entries, now, dataclasses.replace(capacity, arrivals=()))
        state["ends"] = {
            e.job_id: (
                eta._remaining(e, now) if e.running else p.start - now + e.estimate.latency_s
            )
            for e, p in zip(entries, plain, strict=True)
        }
        return _SERVER_WALK(entries, now, capacity)

    if signal is None:
        yield
        return
    saved = (eta.overtaking_window, replay_module.walk)
    eta.overtaking_window, replay_module.walk = window, walk  # type: ignore[assignment]
    try:
        yield
    finally:
        eta.overtaking_window, replay_module.walk = saved  # type: ignore[assignment]


def _seed(path: Path) -> int:
    found = re.search(r"-s(\d+)\.json", path.name)
    return int(found.group(1)) if found else 0


def _traces(paths: Sequence[Path]) -> dict[Path, dict[str, Any]]:
    return {p: read_summary(p) for p in paths}


def run(
    traces: dict[Path, dict[str, Any]], cut: dict[str, Any] | None, alerts: bool = False
) -> dict[Path, dict[str, Any]]:
    """Each run's median error behind >= 3 at submission and halfway under ``cut`` (the
    :class:`DrainSignal` fields; None: the server's walk)."""
    out = {}
    for path, summary in traces.items():
        base = summary.get("service_times_at_start", summary.get("service_times_solo"))
        signal = None if cut is None else DrainSignal(**cut)
        if cut is not None and cut["kind"] == "regime":  # not a signal: the run's own --load
            signal = DrainSignal("always") if "load1" in path.name else None
        with cut_by(signal):
            jobs = replay(summary["eta_records"], SERVER_WALK, base, arrivals_before(summary))
        measured = set(summary["measured_ids"])
        deep = errors(jobs, measured)["behind_3"]
        ended = [j for j in jobs if j.job_id in measured and j.end is not None]
        t0 = min(j.arrival for j in ended)
        out[path] = {
            "sub": deep["submission"]["median_rel"],
            "half": deep.get("halfway", {}).get("median_rel"),
            "alerts": deadline_alerts(jobs) if alerts else None,
            # each deep job's submission after the stream's first, and its signed error
            "jobs": [
                (j.arrival - t0, (j.first - j.end) / (j.end - j.arrival))
                for j in ended
                if j.position >= 3 and j.state == "succeeded" and j.end > j.arrival  # type: ignore[operator]
            ],
        }
    return out


BANDS_S = ((0.0, 5.0), (5.0, 15.0), (15.0, 30.0), (30.0, math.inf))


def bands(traces: dict[Path, dict[str, Any]]) -> None:
    """The deep jobs pooled by when in the stream they were submitted: median |error| and
    signed error under the server's walk and cut at every walk, the --load 1.0 runs and
    the rest apart: where the choice of the window matters."""
    server, cut = run(traces, None), run(traces, _cut("always"))
    for load1 in (True, False):
        for lo, hi in BANDS_S:
            cells = []
            for results in (server, cut):
                errs = [
                    e
                    for p, r in results.items()
                    if ("load1" in p.name) == load1
                    for at, e in r["jobs"]
                    if lo <= at < hi
                ]
                cells.append(
                    f"{statistics.median(abs(e) for e in errs):6.1%} "
                    f"({statistics.median(errs):+6.1%})"
                )
            print(
                f"{'--load 1.0' if load1 else 'the rest':10} submitted {lo:3.0f}-{hi:3.0f} s: "
                f"{len(errs):3} jobs, server {cells[0]}, cut always {cells[1]}"
            )


def _median(results: dict[Path, dict[str, Any]], paths: Sequence[Path]) -> float:
    return statistics.median(results[p]["sub"] for p in paths) if paths else math.nan


def line(name: str, results: dict[Path, dict[str, Any]]) -> str:
    paths = list(results)
    subs = [results[p]["sub"] for p in paths]
    halves = [results[p]["half"] for p in paths if results[p]["half"] is not None]
    a = [p for p in paths if _seed(p) in (0, 2)]
    b = [p for p in paths if _seed(p) not in (0, 2)]
    load1 = [p for p in paths if "load1" in p.name]
    rest = [p for p in paths if "load1" not in p.name]
    text = (
        f"{name:26} median {statistics.median(subs):6.1%} ({sum(s <= GOAL for s in subs)} of "
        f"{len(subs)} <= 20 %), worst {max(subs):6.1%}, halfway {statistics.median(halves):6.1%}"
        f" | seeds 0+2 {_median(results, a):6.1%}, 1+3 {_median(results, b):6.1%}"
        f" | load 1.0 {_median(results, load1):6.1%}, the rest {_median(results, rest):6.1%}"
    )
    got = [results[p]["alerts"] for p in paths if results[p]["alerts"] is not None]
    if got:
        text += (
            f" | misses {sum(x['misses'] for x in got)}, predicted "
            f"{sum(x['predicted'] for x in got)}, "
            f"false alerts {sum(x['false_alerts'] for x in got)}"
        )
    return text


def _cut(
    kind: str, window_s: float = 60.0, lo: float = 0.0, hi: float | None = None, **kw: Any
) -> dict[str, Any]:
    return {"kind": kind, "window_s": window_s, "lo": lo, "hi": lo if hi is None else hi, **kw}


VARIANTS: dict[str, dict[str, Any] | None] = {
    "server (whole horizon)": None,
    "cut always (session 37)": _cut("always"),
    "busy 20 s <= 0.35": _cut("busy", 20.0, 0.35),
    "wait started 20 s <= 0.05": _cut("wait", 20.0, 0.05),
    "queued trend 60 s <= 0.1": _cut("trend", 60.0, 0.1),
    "backlog trend 60 s <= 0.15": _cut("btrend", 60.0, 0.15),
    "backlog trend 60 s <= 0.2": _cut("btrend", 60.0, 0.2),
    "backlog trend 20 s <= 0.3": _cut("btrend", 20.0, 0.3),
    "counted load <= 1.5": _cut("load", 0.0, 1.5),
    # between lo and hi the two windows blended linearly
    "backlog trend 60 s 0-0.5": _cut("btrend", 60.0, 0.0, 0.5),
    "counted load 1.0-1.5": _cut("load", 0.0, 1.0, 1.5),
    "counted load 1.2-1.6": _cut("load", 0.0, 1.2, 1.6),
    # not a signal: cut on the eight --load 1.0 runs only (the file names), as if the
    # regime were known
    "perfect regime": _cut("regime"),
}


def grid() -> dict[str, dict[str, Any]]:
    out = {}
    for w in (20.0, 60.0):
        for th in (0.35, 0.4, 0.45, 0.5, 0.55, 0.6):
            out[f"busy {w:.0f} s <= {th}"] = _cut("busy", w, th)
        for th in (0.05, 0.1, 0.25, 0.5):
            out[f"wait started {w:.0f} s <= {th}"] = _cut("wait", w, th)
            out[f"wait with queued {w:.0f} s <= {th}"] = _cut("wait", w, th, include_queued=True)
    for w in (20.0, 30.0, 45.0, 60.0, 90.0):
        for th in (0.0, 0.05, 0.1, 0.15, 0.2):
            out[f"queued trend {w:.0f} s <= {th}"] = _cut("trend", w, th)
        for th in (0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4):
            out[f"backlog trend {w:.0f} s <= {th}"] = _cut("btrend", w, th)
    for th in (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6):
        out[f"counted load <= {th}"] = _cut("load", 0.0, th)
    return out


def held_out(
    results: dict[str, dict[Path, dict[str, Any]]], server: dict[Path, dict[str, Any]]
) -> None:
    """Per family of signals: the rule the tuning half chooses (its median over runs, ties
    by its mean), never-cut (the server) among the choices, scored on the other half."""
    paths = list(server)
    splits = {
        "seeds 0+2 -> 1+3": [p for p in paths if _seed(p) in (0, 2)],
        "seeds 1+3 -> 0+2": [p for p in paths if _seed(p) not in (0, 2)],
        "seed 0 -> 1-3": [p for p in paths if _seed(p) == 0],
        "seeds 1-3 -> 0": [p for p in paths if _seed(p) != 0],
    }
    families: dict[str, list[str]] = {}
    for name in results:
        families.setdefault(name.split(" <=")[0].rsplit(" ", 2)[0], []).append(name)
    for family, names in families.items():
        print(f"{family}:")
        for split, tune in splits.items():
            score = [p for p in paths if p not in tune]
            options = {**{n: results[n] for n in names}, "server": server}

            def rank(n: str, tune: list[Path] = tune, options: dict = options) -> tuple:
                mean = statistics.mean(options[n][p]["sub"] for p in tune)
                return round(_median(options[n], tune), 4), mean

            best = min(options, key=rank)
            print(
                f"  {split:17} chooses {best:30} tuning half {_median(options[best], tune):6.1%} "
                f"(server {_median(server, tune):6.1%}), "
                f"held out {_median(options[best], score):6.1%} "
                f"(server {_median(server, score):6.1%}), all runs "
                f"{statistics.median(options[best][p]['sub'] for p in paths):6.1%}"
            )


def _signal_values(
    summary: dict[str, Any], kinds: dict[str, dict[str, Any]]
) -> tuple[list[Replayed], dict[float, dict[str, float | None]]]:
    """The server's walk replayed on one run, and each signal's value at each walk."""
    meters = {k: DrainSignal(**v) for k, v in kinds.items()}
    seen: dict[float, dict[str, float | None]] = {}

    def walk(entries: Sequence[Entry], now: float, capacity: Capacity) -> list[Eta]:
        for meter in meters.values():
            meter.observe(now, entries, capacity)
        seen[now] = {k: m.value(now) for k, m in meters.items()}
        return _SERVER_WALK(entries, now, capacity)

    saved, replay_module.walk = replay_module.walk, walk  # type: ignore[assignment]
    try:
        base = summary.get("service_times_at_start", summary.get("service_times_solo"))
        jobs = replay(summary["eta_records"], SERVER_WALK, base, arrivals_before(summary))
    finally:
        replay_module.walk = saved  # type: ignore[assignment]
    return jobs, seen


def signals(traces: dict[Path, dict[str, Any]]) -> None:
    """Each signal per run: its median over the walks of the first and the second half of
    the stream, and at the deep jobs' submissions in the first 15 s and later."""
    kinds = {
        "busy 20 s": _cut("busy", 20.0),
        "wait 20 s": _cut("wait", 20.0),
        "wait 60 s": _cut("wait", 60.0),
        "queued trend 60 s": _cut("trend", 60.0),
        "backlog trend 60 s": _cut("btrend", 60.0),
        "counted load": _cut("load"),
    }
    table: dict[str, dict[str, tuple[float, ...]]] = {k: {} for k in kinds}
    for path, summary in traces.items():
        jobs, seen = _signal_values(summary, kinds)
        measured = [j for j in jobs if j.job_id in set(summary["measured_ids"]) and j.end]
        t0, t1 = min(j.arrival for j in measured), max(j.end or 0.0 for j in measured)
        deep = [j for j in measured if j.position >= 3 and j.state == "succeeded"]
        groups = (
            [t for t in seen if t0 <= t < (t0 + t1) / 2],
            [t for t in seen if (t0 + t1) / 2 <= t <= t1],
            [j.arrival for j in deep if j.arrival - t0 < DEEP_EARLY_S],
            [j.arrival for j in deep if j.arrival - t0 >= DEEP_EARLY_S],
        )
        for k in kinds:
            values = [
                [seen[t][k] for t in g if t in seen and seen[t][k] is not None] for g in groups
            ]
            table[k][path.name] = tuple(statistics.median(v) if v else math.nan for v in values)  # type: ignore[arg-type]
    print(
        "signal: medians per run, min-max over the --load 1.0 runs vs the rest: first half | "
        "second half | deep jobs submitted in the first 15 s | later"
    )
    for k, rows in table.items():

        def span(load1: bool, i: int, rows: dict = rows) -> str:
            got = [
                v[i] for n, v in rows.items() if ("load1" in n) == load1 and not math.isnan(v[i])
            ]
            return f"{min(got):5.2f}-{max(got):5.2f}" if got else "    -      "

        print(f"{k:19} " + " | ".join(f"{span(True, i)} vs {span(False, i)}" for i in range(4)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", type=Path, nargs="+")
    parser.add_argument("--signals", action="store_true", help="the signals per run")
    parser.add_argument("--grid", action="store_true", help="every threshold, held out")
    parser.add_argument("--bands", action="store_true", help="deep jobs by submission time")
    args = parser.parse_args()
    traces = _traces(args.summaries)
    if args.bands:
        bands(traces)
        return
    if args.signals:
        signals(traces)
        return
    if args.grid:
        server = run(traces, None)
        results = {}
        for name, cut in grid().items():
            results[name] = run(traces, cut)
            print(line(name, results[name]), flush=True)
        held_out(results, server)
        return
    for name, cut in VARIANTS.items():
        print(line(name, run(traces, cut, alerts=True)), flush=True)


if __name__ == "__main__":
    main()
