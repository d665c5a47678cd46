"""Where a core idles in one study: every thread's CPU time over the run, by stage.

Issue 19 goal 1 asks for both cores busy through the whole study. This runs the bench
child's study (warm sessions, then :func:`radserve.pipeline.study.run_study`) in this
process while a sampler thread reads each thread's CPU time from
``/proc/self/task/*/schedstat`` (nanoseconds) every ``--interval`` seconds. Stage
markers come from the run's :class:`~radserve.progress.StageTimer` and from wrappers
around a few run-path functions (looked up by name, so the same tool measures an
older tree). It prints, per phase of the main thread (in time order), each thread
group's CPU-seconds, and the **phase bound**: ``max(the busiest thread's CPU-s, all
threads' CPU-s / cores)``, what the phase would take on idle cores if its work were
spread perfectly. Summed over the phases, that is the critical path the wall time on an
idle ``cores``-core machine follows (a network's phase counts as divisible:
:func:`phase_bound`); the difference to ``all CPU-s / cores`` is the time
a core idles because the work is serial. A timeline, one row per thread group, one
column per ``--bin`` seconds, shows where.

    PYTHONPATH=src python tools/thread_timeline.py STUDY [--precision fp32] [--json OUT]
    python tools/thread_timeline.py --show OUT.json       # the table and timeline again
    # A/B alternating, a before tree against this one (labels hashed, figures per run):
    python tools/thread_timeline.py STUDY --ab BEFORE/src AFTER/src --rounds 3

STUDY is a DICOM folder, e.g. the bench study:
``python -c "from pathlib import Path; from radserve.bench.study import ensure_study;
print(ensure_study(Path('/tmp/radserve-bench'), 'explicit', 300))"``.
CPU-seconds on a loaded host are inflated (shared caches), and a descheduled thread
shows as idle in the timeline, so read the phase CPU-s and bounds, not the wall.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

SAMPLER = "timeline-sampler"

# run-path functions whose calls become phase markers: (module, attribute, marker)
MARKED = (
    ("radserve.pipeline.volume.VolumeRun", "next_step", "make task"),
    ("radserve.pipeline.volume.VolumeRun", "complete_step", "postprocess"),
    ("radserve.pipeline.volume", "clean_label_map", "clean-up"),
    ("radserve.pipeline.volume", "organ_measurements", "organ measurements"),
    ("radserve.pipeline.volume", "find_lesions", "find lesions"),
    ("radserve.pipeline.study", "_write_outputs", "report: files"),
    ("radserve.pipeline.study", "write_key_images", "report: key images"),
    ("radserve.pipeline.study", "write_label_map", "report: label map"),
    ("radserve.pipeline.study", "_features", "report: drift features"),
    ("radserve.pipeline.study", "_build_report", "report: build"),
    ("radserve.pipeline.study", "write_report", "report: write json"),
    ("radserve.inference.runner", "release_arena", "release arena"),
)


class Markers:
    """Intervals ``(name, thread name, start, end)`` on the perf_counter clock."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float]] = []
        self._lock = threading.Lock()

    def add(self, name: str, t0: float, t1: float) -> None:
        with self._lock:
            self.spans.append((name, threading.current_thread().name, t0, t1))

    # ProgressSink
    def start(self, stage: str, total: int | None) -> None:
        pass

    def advance(self, stage: str, amount: int = 1) -> None:
        pass

    def finish(self, stage: str, seconds: float) -> None:
        t1 = time.perf_counter()
        self.add(stage, t1 - seconds, t1)


def instrument(markers: Markers) -> None:
    """Wrap the :data:`MARKED` functions that exist in the imported tree."""
    import importlib

    for owner, attr, name in MARKED:
        module_name, _, cls = owner.rpartition(".")
        try:
            target: Any = importlib.import_module(owner)
        except ImportError:
            target = getattr(importlib.import_module(module_name), cls, None)
        fn = getattr(target, attr, None) if target is not None else None
        if fn is None:
            continue

        def wrapped(*args: Any, __fn: Any = fn, __name: str = name, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return __fn(*args, **kwargs)
            finally:
                marker = __name
                if __name in ("make task", "postprocess") and args:
                    run = args[0]
                    spec = getattr(getattr(run, "_pending", None), "bundle", None)
                    step = getattr(run, "_step", None)
                    model = spec.spec.name if spec is not None else getattr(step, "model", "")
                    marker = f"{model}: {__name}"
                markers.add(marker, t0, time.perf_counter())

        setattr(target, attr, functools.wraps(fn)(wrapped))


class Sampler:
    """Each thread's CPU nanoseconds (``schedstat``) every ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=SAMPLER, daemon=True)

    def _read(self) -> dict[int, int]:
        # Python 3.11 does not name OS threads: its own threads are named from here,
        # the rest (the provider's pool) are not Python threads
        for thread in threading.enumerate():
            if thread.native_id is not None:
                self.names.setdefault(thread.native_id, thread.name)
        out: dict[int, int] = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                    out[int(tid)] = int(f.read().split()[0])
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self._read()))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.perf_counter(), self._read()))


def _group(name: str | None, tid: int, main_tid: int) -> str:
    """Thread groups: the main thread, Python threads by name (numbered pool threads
    together), every other thread (the network provider's pool) as one."""
    if tid == main_tid:
        return "main"
    if name is None:
        return "provider pool"
    return name.rstrip("0123456789_-") or name


def phases(markers: Markers, t0: float, t1: float) -> list[tuple[str, float, float]]:
    """The main thread's time cut at every marker's start and end, each piece named by
    the innermost marker covering it (``between`` where none does), in time order."""
    main = threading.main_thread().name
    spans = [s for s in markers.spans if s[1] == main and s[3] > t0 and s[2] < t1]
    cuts = sorted({t0, t1, *(max(t0, s[2]) for s in spans), *(min(t1, s[3]) for s in spans)})
    out: list[tuple[str, float, float]] = []
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        covering = [s for s in spans if s[2] <= mid < s[3]]
        name = min(covering, key=lambda s: s[3] - s[2])[0] if covering else "between"
        if out and out[-1][0] == name and abs(out[-1][2] - a) < 1e-9:
            out[-1] = (name, out[-1][1], b)
        else:
            out.append((name, a, b))
    return out


def phase_bound(phase: str, cpu: float, busiest: float, cores: int) -> float:
    """How long a phase takes on ``cores`` idle cores at the least: its CPU-s spread over
    them, or its busiest thread's CPU-s where that is longer. Not so for a network's
    phase: the provider divides each batch between its threads (TBB work stealing), and
    on a loaded host the calling thread takes the chunks of a descheduled worker (the
    organ network alone, load 10: calling thread 0.83 CPU-s, worker 0.39, the worker
    5.4 s waiting for a core), so its busiest thread says nothing of idle cores; the
    lesion step used 1.90 of 2 quiet cores in session 15."""
    if phase.endswith(": inference"):
        return cpu / cores
    return max(busiest, cpu / cores)


def analyse(
    sampler: Sampler, markers: Markers, t0: float, t1: float, cores: int, bin_s: float
) -> dict[str, Any]:
    """CPU-s per phase and thread group, phase bounds, and the binned timeline."""
    main_tid = threading.main_thread().native_id
    tids = {tid for _, sample in sampler.samples for tid in sample}
    groups = {tid: _group(sampler.names.get(tid), tid, main_tid) for tid in tids}
    phase_list = phases(markers, t0, t1)
    per_phase: list[dict[str, Any]] = [
        {"phase": n, "wall_s": b - a, "cpu_s": defaultdict(float), "threads": defaultdict(float)}
        for n, a, b in phase_list
    ]
    bins = max(1, int((t1 - t0) / bin_s) + 1)
    timeline: dict[str, list[float]] = defaultdict(lambda: [0.0] * bins)
    for (ta, a), (tb, b) in zip(sampler.samples, sampler.samples[1:], strict=False):
        mid = (ta + tb) / 2
        if not t0 <= mid <= t1:
            continue
        k = next((i for i, (_, pa, pb) in enumerate(phase_list) if pa <= mid < pb), None)
        col = min(bins - 1, int((mid - t0) / bin_s))
        for tid, ns in b.items():
            cpu = (ns - a.get(tid, ns)) / 1e9
            group = groups.get(tid, "other")
            if cpu <= 0 or group == SAMPLER:
                continue
            timeline[group][col] += cpu
            if k is not None:
                per_phase[k]["cpu_s"][group] += cpu
                per_phase[k]["threads"][tid] += cpu
    rows = [
        {
            "phase": p["phase"],
            "wall_s": round(p["wall_s"], 4),
            "cpu_s": round(sum(p["cpu_s"].values()), 4),
            "busiest_thread_cpu_s": round(max(p["threads"].values(), default=0.0), 4),
            "by_group": {g: round(c, 4) for g, c in sorted(p["cpu_s"].items())},
        }
        for p in per_phase
    ]
    sub = defaultdict(float)
    for name, _, a, b in markers.spans:
        if t0 <= a and b <= t1:
            sub[name] += b - a
    return bounded(
        {
            "cores": cores,
            "wall_s": t1 - t0,
            "phases": rows,
            "marker_wall_s": {k: round(v, 4) for k, v in sorted(sub.items())},
            "timeline_bin_s": bin_s,
            "timeline": {g: [round(c, 4) for c in v] for g, v in timeline.items()},
        }
    )


def bounded(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with each phase's bound and idle core-seconds, and the totals: CPU-s,
    the critical path (the bounds summed), its perfect spread and the serial excess."""
    cores, total, path = result["cores"], 0.0, 0.0
    for p in result["phases"]:
        bound = phase_bound(p["phase"], p["cpu_s"], p["busiest_thread_cpu_s"], cores)
        p["bound_s"], p["idle_core_s"] = round(bound, 4), round(cores * bound - p["cpu_s"], 4)
        total, path = total + p["cpu_s"], path + bound
    result.update(
        cpu_s=total,
        critical_path_s=path,
        perfect_s=total / cores,
        serial_excess_s=path - total / cores,
    )
    return result


SHADE = " .:-=+*#%@"  # share of one core, 0 .. 1


def _rows(cols: dict[str, list[float]], busy: list[float], bin_s: float) -> list[str]:
    lines = [
        f"{group[:18]:>18} |" + "".join(SHADE[min(9, int(10 * c / bin_s))] for c in v)
        for group, v in sorted(cols.items())
    ]
    lines.append(f"{'cores busy':>18} |" + "".join(str(min(9, round(b))) for b in busy))
    return lines


def draw(result: dict[str, Any], width: int = 100) -> str:
    """The timeline as text, at most ``width`` columns, per thread group the share of one
    core it used (' ' none .. '@' all): as measured (on a loaded host each runnable
    thread gets a share of a core, so a serial phase looks no emptier than a parallel
    one), then as the phase table implies on idle cores (each phase as long as its
    bound, each group at its CPU-s over that): where a core idles."""
    cols = result["timeline"]
    n = max(len(v) for v in cols.values())
    merge = max(1, -(-n // width))
    bin_s = result["timeline_bin_s"] * merge
    cols = {g: [sum(v[i : i + merge]) for i in range(0, n, merge)] for g, v in cols.items()}
    busy = [sum(column) / bin_s for column in zip(*cols.values(), strict=True)]
    lines = [f"measured: one column = {bin_s * 1e3:.0f} ms", *_rows(cols, busy, bin_s)]
    phases_ = [p for p in result["phases"] if p["bound_s"] > 0]
    step = result["critical_path_s"] / width
    groups = sorted({g for p in phases_ for g in p["by_group"]})
    ideal: dict[str, list[float]] = {g: [] for g in groups}
    ideal_busy: list[float] = []
    at, k = 0.0, 0
    for col in range(width):
        mid = (col + 0.5) * step
        while k < len(phases_) - 1 and at + phases_[k]["bound_s"] <= mid:
            at += phases_[k]["bound_s"]
            k += 1
        p = phases_[k]
        for g in groups:
            ideal[g].append(p["by_group"].get(g, 0.0) / p["bound_s"] * step)
        ideal_busy.append(p["cpu_s"] / p["bound_s"])
    lines += [
        f"on {result['cores']} idle cores (phase bounds): one column = {step * 1e3:.0f} ms",
        *_rows(ideal, ideal_busy, step),
    ]
    return "\n".join(lines)


def labels_sha256(study_result: Any) -> dict[str, str]:
    """SHA-256 of every step's label map and findings map, and of the report's findings
    and organ measurements (what the overlapped and serial orders must agree on)."""
    out: dict[str, str] = {}
    for step in study_result.volume_result.steps:
        out[step.name] = hashlib.sha256(step.labels.array.tobytes()).hexdigest()
        if step.finding_labels is not None:
            found = step.finding_labels.array.tobytes()
            out[f"{step.name}: findings"] = hashlib.sha256(found).hexdigest()
    report = study_result.report
    facts = json.dumps(
        [
            [f.model_dump(mode="json") for f in report.findings],
            [m.model_dump(mode="json") for m in report.organ_measurements],
        ],
        sort_keys=True,
    )
    out["report findings + organs"] = hashlib.sha256(facts.encode()).hexdigest()
    return out


def run_one(study: Path, precision: str, interval: float, bin_s: float) -> dict[str, Any]:
    from radserve.bench.child import PIPELINE, _warm
    from radserve.host import usable_cores
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline import SessionPool, release_free_memory
    from radserve.pipeline.spec import load_pipeline
    from radserve.pipeline.study import run_study

    registry, pool = ModelRegistry(), SessionPool()
    _warm(pool, registry, precision)
    release_free_memory()
    markers = Markers()
    instrument(markers)
    with tempfile.TemporaryDirectory() as out, Sampler(interval) as sampler:
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = run_study(
            study,
            pipeline=load_pipeline(PIPELINE),
            out_dir=Path(out),
            registry=registry,
            sessions=pool,
            precision=precision,  # type: ignore[arg-type]
            progress=markers,
        )
        t1 = time.perf_counter()
        cpu = time.process_time() - c0
    analysis = analyse(sampler, markers, t0, t1, usable_cores(), bin_s)
    analysis["process_cpu_s"] = cpu
    analysis["labels_sha256"] = labels_sha256(result)
    analysis["stages"] = result.report.timings
    analysis["load_average"] = os.getloadavg()
    return analysis


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'phase':<28} {'wall':>7} {'CPU-s':>7} {'busiest':>7} {'bound':>7} {'idle':>7}  groups"
    ]
    for p in result["phases"]:
        groups = ", ".join(f"{g} {c:.2f}" for g, c in p["by_group"].items() if c >= 0.005)
        lines.append(
            f"{p['phase'][:28]:<28} {p['wall_s']:7.3f} {p['cpu_s']:7.3f} "
            f"{p['busiest_thread_cpu_s']:7.3f} {p['bound_s']:7.3f} {p['idle_core_s']:7.3f}"
            f"  {groups}"
        )
    lines.append(
        f"total: wall {result['wall_s']:.2f} s, CPU {result['cpu_s']:.2f} s (process "
        f"{result['process_cpu_s']:.2f}); critical path {result['critical_path_s']:.2f} s on "
        f"{result['cores']} cores, perfect {result['perfect_s']:.2f} s, serial excess "
        f"{result['serial_excess_s']:.2f} s; load {result['load_average'][0]:.1f}"
    )
    return "\n".join(lines)


def alternate(args: argparse.Namespace) -> None:
    """Before and after trees in turn, each run in a fresh process."""
    runs: dict[str, list[dict[str, Any]]] = {src: [] for src in args.ab}
    for _ in range(args.rounds):
        for src in args.ab:
            env = {**os.environ, "PYTHONPATH": src}
            cmd = [sys.executable, __file__, str(args.study), "--precision", args.precision]
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                subprocess.run([*cmd, "--json", out.name, "--quiet"], env=env, check=True)
                result = bounded(json.loads(Path(out.name).read_text()))
            runs[src].append(result)
            print(
                f"{src}: wall {result['wall_s']:.2f} s, CPU {result['cpu_s']:.2f} s, critical "
                f"path {result['critical_path_s']:.2f} s (serial excess "
                f"{result['serial_excess_s']:.2f}), load {result['load_average'][0]:.1f}, "
                f"labels {sorted(result['labels_sha256'].values())[0][:8]}…",
                flush=True,
            )
    for src, results in runs.items():
        print(
            f"{src}: median wall {statistics.median(r['wall_s'] for r in results):.2f} s, "
            f"CPU {statistics.median(r['cpu_s'] for r in results):.2f} s, critical path "
            f"{statistics.median(r['critical_path_s'] for r in results):.2f} s, serial excess "
            f"{statistics.median(r['serial_excess_s'] for r in results):.2f} s"
        )
    hashes = {json.dumps(r["labels_sha256"], sort_keys=True) for rs in runs.values() for r in rs}
    print("labels and report facts identical in every run:", len(hashes) == 1)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, nargs="?")
    parser.add_argument("--show", help="print the table and timeline of a --json file")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--interval", type=float, default=0.01, help="sampling, seconds")
    parser.add_argument("--bin", type=float, default=0.05, help="timeline bin, seconds")
    parser.add_argument("--width", type=int, default=100, help="timeline columns at most")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no table or timeline")
    parser.add_argument("--ab", nargs=2, metavar="SRC", help="alternate two source trees")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.show:
        shown = bounded(json.loads(Path(args.show).read_text()))
        print(table(shown))
        print(draw(shown, args.width))
        return
    if args.ab:
        alternate(args)
        return
    result = run_one(args.study, args.precision, args.interval, args.bin)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if not args.quiet:
        print(table(result))
        print(draw(result, args.width))
        print(json.dumps(result["labels_sha256"], indent=1))


if __name__ == "__main__":
    main()
