"""Where a receiver's time goes between a study's critical notices: ``radserve bench
--scenario critical`` run in this process, with its outbox rows kept and, with
``--trace``, each sender thread's claim / send / settle timed.

    PYTHONPATH=src:. python tools/critical_send_gaps.py --studies 4 --routine 2 --trace

Per receiver, from the rows (``created`` = the result existed, ``sent_at`` = acknowledged):
result -> acknowledgement of every notice, of each study's first and of its last, how
many within 1.5 s, and the gap between consecutive acknowledgements of one study's
notices. ``--trace`` wraps ``OutboxStore.claim_due`` (critical rows),
``CriticalOutbox._send``, ``radserve.critical.push.settle`` and ``CriticalOutbox._record``
when the tree has them (it runs against any tree: ``PYTHONPATH`` decides which sources
are measured), so a before/after pair uses the same harness. ``--rounds N --trees A,B``:
N rounds alternating the trees, each run in its own process, and per tree all rounds'
notices pooled.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

LIMIT_S = 1.5


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "median_s": round(statistics.median(ordered), 3),
        "p95_s": round(p95, 3),
        "max_s": round(ordered[-1], 3),
        "within_limit": sum(v <= LIMIT_S for v in values),
    }


class _Trace:
    """Per sender thread: (stage, seconds) of each claim, send and settle."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[str, float]]] = defaultdict(list)
        self._lock = threading.Lock()

    def wrap(self, owner: Any, name: str, stage: str, only: Any = None) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if only is None or only(args, kwargs):
                    with self._lock:
                        self.events[threading.current_thread().name].append(
                            (stage, time.perf_counter() - start)
                        )

        setattr(owner, name, timed)

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        out: dict[str, dict[str, dict[str, float]]] = {}
        for thread, events in sorted(self.events.items()):
            if not thread.startswith("radserve-critical-"):
                continue
            stages: dict[str, list[float]] = defaultdict(list)
            for stage, seconds in events:
                stages[stage].append(seconds * 1000)
            out[thread.removeprefix("radserve-critical-")] = {
                stage: {
                    "n": len(ms),
                    "median_ms": round(statistics.median(ms), 2),
                    "p95_ms": round(sorted(ms)[round(0.95 * (len(ms) - 1))], 2),
                    "total_ms": round(sum(ms), 1),
                }
                for stage, ms in sorted(stages.items())
            }
        return out


def _install_trace() -> _Trace:
    from radserve.critical import push
    from radserve.store.outbox import OutboxKind, OutboxStore

    trace = _Trace()
    trace.wrap(
        OutboxStore,
        "claim_due",
        "claim",
        only=lambda args, kwargs: kwargs.get("kind") == OutboxKind.CRITICAL,
    )
    trace.wrap(push.CriticalOutbox, "_send", "send")
    trace.wrap(push, "settle", "settle")  # before: one commit per notice, in the sender
    trace.wrap(push.CriticalOutbox, "_record", "commit")  # after: a group, its own thread
    return trace


def measure(studies: int, routine: int, trace_on: bool) -> dict[str, Any]:
    """One bench run in this process; the rows' figures (and the trace)."""
    import radserve.bench.critical as bench

    captured: list[Any] = []
    wait_pushed = bench._wait_pushed

    def keep(service: Any, timeout_s: float) -> list[Any]:
        rows = wait_pushed(service, timeout_s)
        captured.extend(rows)
        return rows

    bench._wait_pushed = keep
    trace = _install_trace() if trace_on else None
    summary = bench.run_critical_bench(
        n_studies=studies, concurrency=routine, log=lambda line: print(line, file=sys.stderr)
    )
    by_receiver: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for row in captured:
        if row.job_id is not None:
            by_receiver[row.destination.removeprefix("critical:")][row.job_id].append(row)
    figures: dict[str, Any] = {}
    for receiver, jobs in sorted(by_receiver.items()):
        every, first, last, gaps, unsent = [], [], [], [], 0
        for rows in jobs.values():
            result_at = min(r.created for r in rows)
            acked = sorted(r.sent_at for r in rows if r.sent_at is not None)
            unsent += len(rows) - len(acked)
            seconds = [(at - result_at).total_seconds() for at in acked]
            every += seconds
            if seconds:
                first.append(seconds[0])
                last.append(seconds[-1])
            gaps += [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(acked)]
        figures[receiver] = {
            "every": _stats(every),
            "first_of_study": _stats(first),
            "last_of_study": _stats(last),
            "gap_ms": {
                "n": len(gaps),
                "median": round(statistics.median(gaps), 2) if gaps else None,
                "p95": round(sorted(gaps)[round(0.95 * (len(gaps) - 1))], 2) if gaps else None,
                "max": round(max(gaps), 2) if gaps else None,
            },
            "not_acknowledged": unsent,
            "values_s": {"every": every, "first_of_study": first, "last_of_study": last},
        }
    return {
        "sources": os.environ.get("PYTHONPATH", ""),
        "critical_findings": summary["critical_findings"],
        "studies_with_critical_findings": summary["studies_with_critical_findings"],
        "succeeded": summary["succeeded"],
        "receivers": figures,
        "result_to_recorded": summary["result_to_recorded"],
        "job_fhir_bundle_result_to_ack": summary["job_fhir_bundle_result_to_ack"],
        "stages": trace.summary() if trace is not None else None,
        "host": summary["host"],
    }


def _alternate(args: argparse.Namespace) -> dict[str, Any]:
    """``--rounds`` rounds, each tree once per round, each run in its own process; the
    runs and, per tree, every round's notices pooled."""
    runs = []
    for round_ in range(args.rounds):
        for tree in args.trees.split(","):
            env = {**os.environ, "PYTHONPATH": f"{tree}:{Path(__file__).parent.parent}"}
            command = [sys.executable, __file__, "--studies", str(args.studies),
                       "--routine", str(args.routine)]  # fmt: skip
            if args.trace:
                command.append("--trace")
            started = time.time()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            run = json.loads(done.stdout)
            run.update(round=round_, tree=tree, wall_s=round(time.time() - started, 1))
            print(json.dumps({k: v for k, v in run.items() if k != "receivers"}), file=sys.stderr)
            runs.append(run)
    pooled: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        for receiver, figures in run["receivers"].items():
            for what, values in figures["values_s"].items():
                tree = pooled.setdefault(run["tree"], {}).setdefault(receiver, {})
                tree.setdefault(what, []).extend(values)
    summary = {
        tree: {r: {what: _stats(v) for what, v in f.items()} for r, f in receivers.items()}
        for tree, receivers in pooled.items()
    }
    loads = [(run["tree"], run["host"]["loadavg_before"][0], run["host"]["loadavg_after"][0])
             for run in runs]  # fmt: skip
    return {"pooled": summary, "load_1min_before_after": loads, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=4)
    parser.add_argument("--routine", type=int, default=2, help="studies in flight")
    parser.add_argument("--trace", action="store_true", help="time claim/send/settle")
    parser.add_argument("--rounds", type=int, default=0, help="alternate --trees, N rounds")
    parser.add_argument("--trees", default="", help="comma-separated src folders")
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args()
    if args.rounds:
        out: Any = _alternate(args)
    else:
        out = measure(args.studies, args.routine, args.trace)
    text = json.dumps(out, indent=1)
    if args.json is not None:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
