"""Where a job-status or report read's CPU goes in a real ``radserve serve``.

    PYTHONPATH=src python tools/profile_reads.py --read-processes 2 --out /tmp/reads-prof
    PYTHONPATH=src python tools/profile_reads.py --read-processes 2 --no-profile  # CPU only

The bench's read phase (:mod:`radserve.bench.load`: a spawned server, ``--submissions``
studies processing, 32 connections reading status and the first report) with two
measurements around exactly that phase, in every server process (the serving process
and each API reader):

- the CPU seconds of each thread by name (``pthread_getcpuclockid``: exact, no
  overhead), so the event loop's share is told apart from the audit writer's, the
  worker-thread pool's and inference's;
- unless ``--no-profile``, a cProfile of each process's event-loop thread on that
  thread's CPU clock (``cProfile.Profile(time.thread_time)``: time waiting is not
  counted), and of its audit writer thread, as ``.pstats`` files.

Both are switched on and off by SIGUSR1 through a ``sitecustomize`` module put on the
spawned server's ``PYTHONPATH`` (nothing in radserve itself changes). The summary prints
per-request CPU by thread, the inclusive CPU-µs of a read's plain functions, and the
event loop's CPU by package (exclusive, in %: async functions are timed per resumption,
so only shares add up). cProfile adds its own overhead to the profiled threads (about
3× here: compare their CPU with ``--no-profile``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from radserve.bench import load

_SITE = """
import cProfile, json, os, signal, threading, time

_OUT = os.environ["READS_PROFILE_DIR"]
_PROFILE = os.environ.get("READS_PROFILE_CODE") == "1"
_state = {"on": False, "t0": {}, "loop": None}
_WRITER = "radserve-audit-writer"


def _threads():
    out = {}
    for t in threading.enumerate():
        try:
            clock = time.pthread_getcpuclockid(t.ident)
            out[f"{t.name}#{t.ident}"] = time.clock_gettime(clock)
        except (OSError, TypeError):
            pass
    return out


def _toggle(signum, frame):
    pid = os.getpid()
    if not _state["on"]:
        _state["on"] = True
        _state["t0"] = _threads()
        _state["wall"] = time.perf_counter()
        if _PROFILE:
            _state["loop"] = cProfile.Profile(time.thread_time)
            _state["loop"].enable()
        return
    if _state["loop"] is not None:
        _state["loop"].disable()
        _state["loop"].dump_stats(f"{_OUT}/loop-{pid}.pstats")
        _state["loop"] = None
    t1, t0 = _threads(), _state["t0"]
    cpu = {name: round(t1[name] - t0.get(name, 0.0), 4) for name in t1}
    with open(f"{_OUT}/threads-{pid}.json", "w") as f:
        json.dump({"wall_s": time.perf_counter() - _state["wall"], "cpu_s": cpu}, f)
    _state["on"] = False


signal.signal(signal.SIGUSR1, _toggle)

if _PROFILE:
    _run = threading.Thread.run

    def _profiled_run(self):
        if self.name != _WRITER:
            return _run(self)
        wall = os.environ.get("READS_PROFILE_WRITER_WALL") == "1"
        profile = cProfile.Profile(time.perf_counter if wall else time.thread_time)
        profile.enable()
        try:
            return _run(self)
        finally:
            profile.disable()
            profile.dump_stats(f"{_OUT}/writer-{os.getpid()}-{self.ident}.pstats")

    threading.Thread.run = _profiled_run
"""

# (label, file suffix, function name): inclusive CPU of these plain functions, per
# request (coroutines are left out: cProfile times each resumption of one apart)
PARTS: tuple[tuple[str, str, str], ...] = (
    ("status JSON: JobOut built", "api/schemas.py", "from_record"),
    ("status JSON: serialised", "pydantic/main.py", "model_dump_json"),
    ("job from the snapshot / cache", "api/reader.py", "cached"),
    ("report bytes from memory", "service/jobs.py", "report_cached"),
    ("key remembered (sha256, lock)", "api/auth.py", "remembered"),
    ("audit record queued (submit_read)", "security/access.py", "submit_read"),
    ("Response built", "starlette/responses.py", "__init__"),
    ("uvicorn: bytes received and parsed", "protocols/http/httptools_impl.py", "data_received"),
    ("audit writer: append_audits (one transaction)", "store/access.py", "append_audits"),
    ("  append_many (head, hashes, rows)", "store/audit.py", "append_many"),
    ("  record_hash (canonical JSON + HMAC)", "audit/chain.py", "record_hash"),
    ("  futures resolved", "concurrent/futures/_base.py", "set_result"),
)
# (label, what a profiled function's file or name contains): exclusive CPU by package
PACKAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("uvicorn: parsing, one task per request, send", ("uvicorn",)),
    ("asyncio: select, callbacks, tasks, futures", ("asyncio", "selectors", "epoll")),
    ("anyio: the request timeout's cancel scope, thread hops", ("anyio",)),
    ("Starlette: Request, headers, Response", ("starlette",)),
    ("status JSON: JobOut, pydantic", ("pydantic", "schemas.py", "status_bodies")),
    ("key check, visibility, audit record queued", ("api/auth.py", "security/", "sha256")),
    ("radserve middlewares: metrics, timeout, body limit", ("middleware.py",)),
    ("job snapshot: stat, reloads", ("job_snapshot", "pickle", "posix.stat")),
    ("reader dispatch and route functions", ("reader.py", "routes/jobs.py", "service/jobs.py")),
    ("audit queue and futures", ("audit_batch", "concurrent/futures", "queue")),
)


def _package(filename: str, name: str) -> str:
    for label, needles in PACKAGES:
        if any(n in filename or n in name for n in needles):
            return label
    return "other"


def loop_shares(files: list[Path]) -> dict[str, float]:
    """Exclusive CPU of the profiled event loops by package, in % of their total."""
    stats = pstats.Stats(*map(str, files))
    by: dict[str, float] = {}
    for (filename, _line, name), (_cc, _nc, tt, _ct, _c) in stats.stats.items():  # type: ignore[attr-defined]
        label = _package(filename, name)
        by[label] = by.get(label, 0.0) + tt
    total = sum(by.values()) or 1.0
    return {k: round(100 * v / total, 1) for k, v in sorted(by.items(), key=lambda x: -x[1])}


def _inclusive(stats: pstats.Stats, suffix: str, name: str) -> tuple[float, int]:
    """Inclusive seconds and primitive calls of functions ``name`` in files ending
    ``suffix`` (recursion counted once, as pstats does)."""
    seconds, calls = 0.0, 0
    for (filename, _line, func), (cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if func == name and filename.endswith(suffix):
            seconds += ct
            calls += cc
    return seconds, calls


def summarise(out: Path, requests: int, serving_pid: int) -> dict[str, Any]:
    """Per-request CPU by thread name and by part, from the files the servers wrote."""
    threads: dict[str, float] = {}
    for path in sorted(out.glob("threads-*.json")):
        data = json.loads(path.read_text())
        if path.stem == f"threads-{serving_pid}":
            role = "serving"
        elif any(n.startswith("reader-events") for n in data["cpu_s"]):
            role = "readers"
        else:
            role = "other processes"
        for name, seconds in data["cpu_s"].items():
            label = f"{role}: {name.split('#')[0]}"
            if label.endswith("AnyIO worker thread") or "ThreadPoolExecutor" in label:
                label = f"{role}: worker threads"
            threads[label] = threads.get(label, 0.0) + seconds
    per_request = {k: round(1e6 * v / requests, 1) for k, v in sorted(threads.items()) if v > 0}
    parts: dict[str, Any] = {}
    files = sorted(out.glob("loop-*.pstats")) + sorted(out.glob("writer-*.pstats"))
    if files:
        stats = pstats.Stats(*map(str, files))
        total = sum(tt for (_cc, _nc, tt, _ct, _c) in stats.stats.values())  # type: ignore[attr-defined]
        parts["profiled threads, total (with cProfile's overhead)"] = round(
            1e6 * total / requests, 1
        )
        for label, suffix, name in PARTS:
            seconds, calls = _inclusive(stats, suffix, name)
            if calls:
                parts[label] = {
                    "us_per_request": round(1e6 * seconds / requests, 1),
                    "calls": calls,
                }
    loops = [f for f in out.glob("loop-*.pstats") if f.stem != f"loop-{serving_pid}"]
    loops = loops or sorted(out.glob(f"loop-{serving_pid}.pstats"))  # the one-process layout
    shares = loop_shares(loops) if loops else {}
    return {
        "cpu_us_per_request_by_thread": per_request,
        "parts_us_per_request": parts,
        "event_loop_percent_by_package": shares,
    }


def _pids(root: int) -> list[int]:
    """The server and its Python child processes (each has the SIGUSR1 handler of the
    ``sitecustomize`` or inherited it; a process without one would be killed by it)."""
    pids = [root]
    for child in _children(root):
        try:
            if b"python" in Path(f"/proc/{child}/cmdline").read_bytes():
                pids.append(int(child))
        except OSError:
            continue
    return pids


def _children(pid: int) -> list[str]:
    found: list[str] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += (task / "children").read_text().split()
        except OSError:
            continue
    return found


def _wait_all_finished(url: str, key: str, ids: list[str]) -> None:
    deadline = time.monotonic() + 1800
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30) as client:
        while time.monotonic() < deadline:
            states = {client.get(f"/v1/jobs/{i}").json()["state"] for i in ids}
            if states <= {"succeeded", "failed", "cancelled"}:
                return
            time.sleep(1.0)
    raise SystemExit("the studies did not finish within 30 min")


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("*.pstats"), *args.out.glob("threads-*.json")]:
        old.unlink()
    site = Path(tempfile.mkdtemp(prefix="radserve-reads-site-"))
    (site / "sitecustomize.py").write_text(_SITE)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ["READS_PROFILE_DIR"] = str(args.out)
    os.environ["READS_PROFILE_CODE"] = "0" if args.no_profile else "1"
    os.environ["READS_PROFILE_WRITER_WALL"] = "1" if args.writer_wall else "0"
    study = Path(tempfile.mkdtemp(prefix="radserve-reads-study-"))
    files = load.template_study(study)
    studies = load.distinct_copies(files, args.submissions)
    data = Path(tempfile.mkdtemp(prefix="radserve-reads-data-"))
    process, url, key = load.spawn_server(data / "data", None, read_processes=args.read_processes)
    try:
        ids = asyncio.run(load.submit_all(url, key, studies, 50))[1]
        done = load.wait_for_result(url, key, ids, timeout=300)
        if done is None:
            raise SystemExit("no study finished within 300 s")
        if args.idle:  # nothing processing during the reads
            _wait_all_finished(url, key, ids)
        paths = [f"/v1/jobs/{i}" for i in ids] + [f"/v1/jobs/{done}/report"] * len(ids)
        before = load.job_counts(url, key)
        pids = _pids(process.pid)
        load0 = os.getloadavg()[0]
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        reads = asyncio.run(load.read_load(url, key, paths, args.duration, args.connections))
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        load1 = os.getloadavg()[0]
        time.sleep(1.0)  # the loop profiles are written by the signal handlers
        after = load.job_counts(url, key)
    finally:
        load.stop_server(process)  # the audit writers' profiles are written at their stop
        for folder in (site, study, data):
            shutil.rmtree(folder, ignore_errors=True)
    summary = summarise(args.out, reads.requests, process.pid)
    return {
        "read_processes": args.read_processes,
        "requests": reads.requests,
        "rate": round(reads.rate, 1),
        "latency_ms": reads.latency_ms,
        "errors": reads.errors,
        "running_at_start_end": [before["running"], after["running"]],
        "load_average": [round(load0, 2), round(load1, 2)],
        "profiled": not args.no_profile,
        **summary,
        "files": str(args.out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--read-processes", type=int, default=2, help="0: the one-process layout")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--submissions", type=int, default=20)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("/tmp/radserve-reads-profile"))
    parser.add_argument("--idle", action="store_true", help="read once every study finished")
    parser.add_argument(
        "--writer-wall",
        action="store_true",
        help="profile the audit writer on the wall clock (where it waits), not its CPU",
    )
    parser.add_argument("--no-profile", action="store_true", help="thread CPU only, no cProfile")
    args = parser.parse_args()
    print(json.dumps(run(args), indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
