"""HTTP load on a radserve server, over loopback, for a bounded time.

Two phases, as the service issue asks:

1. ``submit``: N distinct small studies (a phantom with fresh UIDs per copy) submitted
   in parallel; every answer must be 202 (or 200 from the cache): errors are counted.
2. ``read``: while those studies are being processed, job-status and report GETs from
   many keep-alive connections for ``--duration`` seconds; throughput and latency
   percentiles are measured on the client.

The read load uses a minimal HTTP/1.1 client on asyncio streams (one request in flight
per connection), because a general-purpose client would spend more CPU than the server
on a small host. Run it against a server you started, or let it start one (``--spawn``:
``radserve serve`` on a free loopback port, a temporary data folder, an admin key)::

    python -m radserve.bench.load --spawn --duration 10 --connections 32 --submissions 50

With ``--spawn`` it also reads the server's CPU time (Linux ``/proc``) over the read
phase: the event loop's thread (HTTP parsing, routing, auth, serialisation) apart from
all other threads (inference, the audit writer, worker-thread hops), per request.

``--baseline-src DIR`` compares two builds side by side: each round spawns a server from
``DIR`` (the ``src`` folder of another checkout, e.g. a ``git worktree`` of an older
commit) and one from this tree, alternately, each with a fresh data folder and the same
studies; the summary gives the medians and the ratio, with the load average::

    git worktree add /tmp/rs-base <commit>
    python -m radserve.bench.load --spawn --baseline-src /tmp/rs-base/src --rounds 3

``--floor`` measures, in the same run and with the same load generator, what a server that
does nothing but answer gets (:mod:`radserve.bench.load_floor`: uvicorn with a bare
FastAPI or Starlette app answering constant JSON of the sizes radserve answered), alone,
beside busy processes that take the cores as inference does, and with busy threads in its
own process that hold its GIL as radserve's in-process inference threads do; rounds
alternate radserve and the floors, and the summary gives radserve / each floor::

    python -m radserve.bench.load --spawn --floor --rounds 2 --duration 10 --submissions 20

``--floor`` also runs *radserve readers*: the same server with ``server.read_processes``
= ``--read-processes`` (default 2), whose reads are answered by processes that run no
inference (:mod:`radserve.api.reader`); its CPU per request is the readers' and the
serving process's together. With ``--baseline-src`` too, both layouts also run from that
tree in the same rounds (``baseline radserve``, ``baseline radserve readers``): a
before/after with the floors beside it; ``--only NAME`` (repeatable) keeps the named
contestants only::

    python -m radserve.bench.load --spawn --floor --baseline-src /tmp/rs-base/src \
        --only "radserve readers" --only "bare FastAPI" --rounds 2

The server and this client share the machine's cores; the figures are for that setup.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pydicom
from pydicom.uid import generate_uid


@dataclass
class PhaseResult:
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    # the same percentiles per kind of read ("status", "report"): where the wait is
    latency_ms_by_kind: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": round(ordered[-1] * 1000, 2),
        "mean": round(statistics.fmean(ordered) * 1000, 2),
    }


# --- studies ------------------------------------------------------------------------------
def template_study(folder: Path, seed: int = 1) -> list[Path]:
    """A small phantom CT (128x128, 40-60 slices) written to ``folder``."""
    from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series

    phantom = generate_phantom(PhantomSpec.random(seed, small=True))
    return write_dicom_series(phantom, folder)


def distinct_copies(files: list[Path], n: int) -> list[list[bytes]]:
    """``n`` copies of a study, each with new Study/Series/SOP Instance UIDs (so each has
    its own fingerprint and is really processed, not answered from the cache)."""
    datasets = [pydicom.dcmread(p) for p in files]
    copies = []
    for _ in range(n):
        study, series = generate_uid(), generate_uid()
        blobs = []
        for ds in datasets:
            ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
            ds.SOPInstanceUID = generate_uid()
            ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
            buffer = io.BytesIO()
            ds.save_as(buffer, enforce_file_format=True)
            blobs.append(buffer.getvalue())
        copies.append(blobs)
    return copies


# --- phase 1: parallel submissions ------------------------------------------------------------
async def submit_all(
    url: str, key: str, studies: list[list[bytes]], concurrency: int
) -> tuple[PhaseResult, list[str]]:
    headers = {"Authorization": f"Bearer {key}"}
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    ids: list[str] = []
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one(blobs: list[bytes]) -> None:
            files = [("files", (f"{i}.dcm", b, "application/dicom")) for i, b in enumerate(blobs)]
            async with gate:
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v1/studies", files=files, headers=headers)
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                    return
                latencies.append(time.perf_counter() - t0)
            statuses[str(r.status_code)] += 1
            if r.status_code in (200, 202):
                ids.append(r.json()["id"])

        t0 = time.perf_counter()
        await asyncio.gather(*(one(s) for s in studies))
        seconds = time.perf_counter() - t0
    errors = sum(v for k, v in statuses.items() if k not in ("200", "202"))
    result = PhaseResult(len(studies), errors, seconds, dict(statuses), _percentiles(latencies))
    return result, ids


# --- phase 2: reads while processing --------------------------------------------------------
async def _reader(
    host: str,
    port: int,
    requests: list[tuple[str, bytes]],
    start: int,
    deadline: float,
    latencies: dict[str, list[float]],
    statuses: Counter[str],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    index = start
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            kind, request = requests[index % len(requests)]
            writer.write(request)
            index += 1
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12].decode()
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            latencies[kind].append(time.perf_counter() - t0)
            statuses[status] += 1
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        statuses[type(exc).__name__] += 1
    finally:
        writer.close()


async def read_load(
    url: str, key: str, paths: list[str], duration: float, connections: int
) -> PhaseResult:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [
        (
            "report" if p.endswith("/report") else "status",
            f"GET {p} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n".encode(),
        )
        for p in paths
    ]
    latencies: dict[str, list[float]] = {kind: [] for kind, _ in requests}
    statuses: Counter[str] = Counter()
    t0 = time.perf_counter()
    deadline = t0 + duration
    await asyncio.gather(
        *(
            _reader(host, port, requests, i, deadline, latencies, statuses)
            for i in range(connections)
        )
    )
    seconds = time.perf_counter() - t0
    errors = sum(v for k, v in statuses.items() if k != "200")
    every = [t for samples in latencies.values() for t in samples]
    by_kind = {kind: _percentiles(samples) for kind, samples in latencies.items()}
    return PhaseResult(len(every), errors, seconds, dict(statuses), _percentiles(every), by_kind)


# --- the server ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_server(
    data_dir: Path,
    config: Path | None,
    extra: list[str] | None = None,
    *,
    source: Path | None = None,
    read_processes: int | None = None,
) -> tuple[subprocess.Popen[bytes], str, str]:
    """``radserve serve`` on a free loopback port; its URL and a new admin key. With
    ``source`` the server imports radserve from that folder (another checkout's src);
    ``read_processes`` sets ``server.read_processes``."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    if read_processes is not None:
        env["RADSERVE_SERVER__READ_PROCESSES"] = str(read_processes)
    # the key is made by the code that serves (its schema, its audit chain): a subprocess
    make_key = (
        "import sys; from pathlib import Path; from radserve.config import load_settings; "
        "from radserve.store.audited import open_audited; "
        "config = Path(sys.argv[2]) if sys.argv[2] else None; "
        "store, _ = open_audited(load_settings(config, data_dir=Path(sys.argv[1]))); "
        "print(store.create_api_key(name='load test', role='admin')[1]); store.close()"
    )
    made = subprocess.run(
        [sys.executable, "-c", make_key, str(data_dir), str(config or "")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise SystemExit(f"could not create the API key: {made.stderr.strip()[-2000:]}")
    key = made.stdout.strip().splitlines()[-1]
    port = _free_port()
    command = [sys.executable, "-c", "from radserve.cli import main; main()", "serve"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    command += ["--config", str(config)] if config else []
    command += ["--log-level", "warning", *(extra or [])]
    log = open(data_dir / "server.log", "ab")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    # one client for the polls: httpx.get builds a TLS context (loads the CA bundle) per
    # call, which cost this process ~14 CPU-s while a loaded machine started the server
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the server exited ({process.returncode}); see {log.name}")
            try:
                if client.get(f"{url}/readyz", headers={"X-API-Key": key}).is_success:
                    return process, url, key
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not become ready within 120 s")


def job_counts(url: str, key: str) -> dict[str, float]:
    """Jobs running now and jobs succeeded so far, from ``/metrics``."""
    text = httpx.get(f"{url}/metrics", headers={"X-API-Key": key}, timeout=10).text
    counts = {"running": 0.0, "succeeded": 0.0}
    for line in text.splitlines():
        if line.startswith("radserve_jobs_running{"):
            counts["running"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("radserve_jobs_total{") and 'state="succeeded"' in line:
            counts["succeeded"] += float(line.rsplit(" ", 1)[1])
    return counts


def wait_for_result(url: str, key: str, ids: list[str], timeout: float) -> str | None:
    """The first job of ``ids`` to succeed (its report is the report read in phase 2)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=10) as client:
        while time.monotonic() < deadline:
            for job_id in ids[:8]:
                if client.get(f"/v1/jobs/{job_id}").json().get("state") == "succeeded":
                    return job_id
            time.sleep(0.5)
    return None


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process ``pid``'s main thread, which runs uvicorn's
    event loop, and of all its other threads together (Linux; zeros elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    main = others = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0
    for tid in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        fields = stat.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        if int(tid) == pid:
            main = seconds
        else:
            others += seconds
    return main, others


def children_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid``'s child processes (the API readers), all threads."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            total += sum(thread_cpu_s(int(child)))
    return total


def run(args: argparse.Namespace) -> dict[str, Any]:
    files_dir = Path(tempfile.mkdtemp(prefix="radserve-load-study-"))
    try:
        files = sorted(args.study.glob("*.dcm")) if args.study else template_study(files_dir)
        studies = distinct_copies(files, args.submissions)
        if args.floor:
            return with_floors(args, files, studies)
        if args.baseline_src is None:
            return run_once(args, files, studies, read_processes=args.read_processes)
        return compare(args, files, studies)
    finally:
        shutil.rmtree(files_dir, ignore_errors=True)


def run_once(
    args: argparse.Namespace,
    files: list[Path],
    studies: list[list[bytes]],
    source: Path | None = None,
    read_processes: int | None = None,
) -> dict[str, Any]:
    """One load run: spawn (from ``source``, if given; ``read_processes``, if given) or use
    ``--url``; submit; read."""
    workdir = Path(tempfile.mkdtemp(prefix="radserve-load-"))
    process = None
    try:
        if args.spawn:
            extra = ["--worker-nice", str(args.worker_nice)] if args.worker_nice is not None else []
            process, url, key = spawn_server(
                workdir / "data", args.config, extra, source=source, read_processes=read_processes
            )
        else:
            url, key = args.url, args.key or os.environ.get("RADSERVE_KEY", "")
        submitted, ids = asyncio.run(submit_all(url, key, studies, args.submit_concurrency))
        done = wait_for_result(url, key, ids, timeout=300)
        if done is None:
            raise SystemExit("no submitted study finished within 300 s: no report to read")
        paths = [f"/v1/jobs/{i}" for i in ids] + [f"/v1/jobs/{done}/report"] * len(ids)
        sizes = _body_sizes(url, key, ids[0], done)
        before = job_counts(url, key)
        cpu0 = thread_cpu_s(process.pid) if process else (0.0, 0.0)
        readers0 = children_cpu_s(process.pid) if process else 0.0
        load0 = os.getloadavg()[0]
        reads = asyncio.run(read_load(url, key, paths, args.duration, args.connections))
        load1 = os.getloadavg()[0]
        cpu1 = thread_cpu_s(process.pid) if process else (0.0, 0.0)
        readers_s = (children_cpu_s(process.pid) if process else 0.0) - readers0
        after = job_counts(url, key)
        per_request = 1000 / reads.requests if reads.requests else 0.0
        return {
            "server": url,
            "source": str(source) if source else "this tree",
            "study_files": len(files),
            "submit": asdict(submitted) | {"rate": round(submitted.rate, 1)},
            "read": asdict(reads) | {"rate": round(reads.rate, 1)},
            "processing": {
                "running_at_start": before["running"],
                "running_at_end": after["running"],
                "studies_finished_during_reads": after["succeeded"] - before["succeeded"],
            },
            "server_cpu": {
                "event_loop_s": round(cpu1[0] - cpu0[0], 2),
                "other_threads_s": round(cpu1[1] - cpu0[1], 2),
                "event_loop_ms_per_request": round((cpu1[0] - cpu0[0]) * per_request, 3),
                # the API reader processes (server.read_processes), all their threads
                "readers_s": round(readers_s, 2),
                "readers_ms_per_request": round(readers_s * per_request, 3),
            },
            "load_average": [round(load0, 2), round(load1, 2)],
            "connections": args.connections,
            "cpus": os.cpu_count(),
            "body_bytes": sizes,
            "paths": len(paths),
        }
    finally:
        stop_server(process)
        shutil.rmtree(workdir, ignore_errors=True)


def _body_sizes(url: str, key: str, job_id: str, done: str) -> dict[str, int]:
    """The sizes of one job-status body and of the report body radserve answers."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
        status = client.get(f"/v1/jobs/{job_id}", timeout=30)
        report = client.get(f"/v1/jobs/{done}/report", timeout=30)
    return {"status": len(status.content), "report": len(report.content)}


# --- the floor: a server that only answers, same generator, same run ---------------------------
READERS = "radserve readers"  # the contestant with server.read_processes (radserve.api.reader)
BASELINE = "baseline"  # --floor --baseline-src: the other tree's contestants are named so
# (name, framework, busy processes beside the server, busy threads in the server's process)
FLOORS: tuple[tuple[str, str, bool, bool], ...] = (
    ("bare FastAPI", "fastapi", False, False),
    ("bare FastAPI + busy processes", "fastapi", True, False),
    ("bare FastAPI + busy threads (GIL)", "fastapi", False, True),
    ("bare Starlette", "starlette", False, False),
)


def run_floor(
    args: argparse.Namespace,
    framework: str,
    sizes: dict[str, int],
    n_paths: int,
    *,
    busy_processes: bool,
    busy_threads: bool,
) -> dict[str, Any]:
    """One read phase against a bare server (:mod:`radserve.bench.load_floor`) answering
    bodies of ``sizes``: ``n_paths`` paths, half status and half report, as radserve's."""
    neighbours = os.cpu_count() or 2
    nice = args.worker_nice if args.worker_nice is not None else 5
    port = _free_port()
    command = [sys.executable, "-m", "radserve.bench.load_floor", "--port", str(port)]
    command += ["--framework", framework, "--nice", str(nice)]
    command += ["--status-bytes", str(sizes["status"]), "--report-bytes", str(sizes["report"])]
    command += ["--busy-threads", str(neighbours if busy_threads else 0)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    others: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=2) as client:
            while True:
                if process.poll() is not None:
                    _, err = process.communicate()
                    raise SystemExit(f"the floor server exited: {err.decode()[-2000:]}")
                try:
                    if client.get(f"{url}/v1/jobs/ready").is_success:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the floor server did not start within 60 s")
                time.sleep(0.1)
        if busy_processes:
            from radserve.bench.load_floor import busy_neighbours

            others = busy_neighbours(neighbours, nice)
        half = max(1, n_paths // 2)
        paths = [f"/v1/jobs/job-{i}" for i in range(half)]
        paths += ["/v1/jobs/job-0/report"] * half
        cpu0 = thread_cpu_s(process.pid)
        load0 = os.getloadavg()[0]
        reads = asyncio.run(read_load(url, "", paths, args.duration, args.connections))
        load1 = os.getloadavg()[0]
        cpu1 = thread_cpu_s(process.pid)
    finally:
        for other in others:
            other.kill()
            other.wait()
        stop_server(process)
    per_request = 1000 / reads.requests if reads.requests else 0.0
    return {
        "framework": framework,
        "busy_processes": neighbours if busy_processes else 0,
        "busy_threads": neighbours if busy_threads else 0,
        "body_bytes": sizes,
        "read": asdict(reads) | {"rate": round(reads.rate, 1)},
        "server_cpu": {
            "event_loop_s": round(cpu1[0] - cpu0[0], 2),
            "other_threads_s": round(cpu1[1] - cpu0[1], 2),
            "event_loop_ms_per_request": round((cpu1[0] - cpu0[0]) * per_request, 3),
        },
        "load_average": [round(load0, 2), round(load1, 2)],
        "connections": args.connections,
        "cpus": os.cpu_count(),
    }


def with_floors(
    args: argparse.Namespace, files: list[Path], studies: list[list[bytes]]
) -> dict[str, Any]:
    """``--rounds`` rounds of radserve (this tree) and every floor, alternating the order
    (the first round runs radserve first: the floors answer the body sizes it served)."""
    ours = [n for n in ("radserve", READERS) if not args.only or n in args.only]
    if args.baseline_src is not None:  # the same two layouts from another tree, same run
        ours += [f"{BASELINE} {n}" for n in ours]
    floors = [f[0] for f in FLOORS if not args.only or f[0] in args.only]
    if not ours:
        raise SystemExit("--only: name at least one of 'radserve', 'radserve readers'")
    names = [*ours, *floors]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    sizes: dict[str, int] | None = None
    n_paths = 2 * len(studies)
    for i in range(args.rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            if name in ours:
                source = args.baseline_src if name.startswith(BASELINE) else None
                readers = (args.read_processes or 2) if name.endswith(READERS) else 0
                result = run_once(args, files, studies, source, read_processes=readers)
                sizes, n_paths = sizes or result["body_bytes"], result["paths"]
            else:
                assert sizes is not None  # round 1 ran radserve first
                _, framework, processes, threads = next(f for f in FLOORS if f[0] == name)
                result = run_floor(
                    args,
                    framework,
                    sizes,
                    n_paths,
                    busy_processes=processes,
                    busy_threads=threads,
                )
            runs[name].append(result)
            read = result["read"]
            print(
                f"round {i + 1} {name}: {read['rate']:.0f} req/s, p50 "
                f"{read['latency_ms'].get('p50')} ms, p99 {read['latency_ms'].get('p99')} ms, "
                f"({_by_kind(read)}), "
                f"{read['errors']} errors, loop {result['server_cpu']['event_loop_ms_per_request']}"
                f" CPU-ms/req, readers {result['server_cpu'].get('readers_ms_per_request', 0)}"
                f" CPU-ms/req, load {result['load_average']}",
                file=sys.stderr,
            )
    summary: dict[str, Any] = {}
    for name in names:
        cell = runs[name]
        summary[name] = {
            "rate": float(statistics.median(r["read"]["rate"] for r in cell)),
            "p50_ms": float(statistics.median(r["read"]["latency_ms"].get("p50", 0) for r in cell)),
            "p99_ms": round(
                float(statistics.median(r["read"]["latency_ms"].get("p99", 0) for r in cell)), 2
            ),
            "event_loop_ms_per_request": float(
                statistics.median(r["server_cpu"]["event_loop_ms_per_request"] for r in cell)
            ),
            "readers_ms_per_request": float(
                statistics.median(r["server_cpu"].get("readers_ms_per_request", 0) for r in cell)
            ),
            "errors": sum(r["read"]["errors"] for r in cell),
            "p50_p99_ms_by_kind": {
                kind: [
                    float(statistics.median(r["read"]["latency_ms_by_kind"][kind][q] for r in cell))
                    for q in ("p50", "p99")
                ]
                for kind in cell[0]["read"].get("latency_ms_by_kind", {})
            },
        }
    for one in ours:
        summary[one]["processing_throughout"] = all(
            min(r["processing"]["running_at_start"], r["processing"]["running_at_end"]) > 0
            for r in runs[one]
        )
        summary[one]["submit_errors"] = sum(r["submit"]["errors"] for r in runs[one])
    summary["radserve_vs_floor"] = {
        one: {
            name: round(summary[one]["rate"] / summary[name]["rate"], 3)
            if summary[name]["rate"]
            else None
            for name in names
            if name != one
        }
        for one in ours
    }
    loads = [x for cell in runs.values() for r in cell for x in r["load_average"]]
    summary["load_average_range"] = [min(loads), max(loads)]
    summary["body_bytes"] = sizes
    summary["contestants"] = names
    return {"summary": summary, "runs": runs}


def _by_kind(read: dict[str, Any]) -> str:
    """``status p50/p99 …, report p50/p99 …`` of one read phase."""
    return ", ".join(
        f"{kind} p50/p99 {q.get('p50')}/{q.get('p99')} ms"
        for kind, q in read.get("latency_ms_by_kind", {}).items()
    )


def compare(
    args: argparse.Namespace, files: list[Path], studies: list[list[bytes]]
) -> dict[str, Any]:
    """``--rounds`` rounds of (baseline, this tree), alternating; medians and ratios."""
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    for i in range(args.rounds):
        order = [("baseline", args.baseline_src), ("this", None)]
        for name, source in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            readers = args.read_processes if source is None else None  # this tree's setting
            result = run_once(args, files, studies, source, read_processes=readers)
            result["wall_s"] = round(time.perf_counter() - t0, 1)
            runs[name].append(result)
            read = result["read"]
            print(
                f"round {i + 1} {name}: {read['rate']:.0f} req/s, p50 "
                f"{read['latency_ms'].get('p50')} ms, p99 {read['latency_ms'].get('p99')} ms, "
                f"loop {result['server_cpu']['event_loop_ms_per_request']} CPU-ms/req, "
                f"load {result['load_average']}, run {result['wall_s']} s",
                file=sys.stderr,
            )

    def median(name: str, pick: Any) -> float:
        return float(statistics.median(pick(r) for r in runs[name]))

    summary: dict[str, Any] = {}
    for name in runs:
        summary[name] = {
            "rate": median(name, lambda r: r["read"]["rate"]),
            "p50_ms": median(name, lambda r: r["read"]["latency_ms"].get("p50", 0.0)),
            "p99_ms": median(name, lambda r: r["read"]["latency_ms"].get("p99", 0.0)),
            "event_loop_ms_per_request": median(
                name, lambda r: r["server_cpu"]["event_loop_ms_per_request"]
            ),
            "errors": sum(r["read"]["errors"] + r["submit"]["errors"] for r in runs[name]),
            # a run whose studies had all finished (or not started) measured idle reads
            "processing_throughout": all(
                min(r["processing"]["running_at_start"], r["processing"]["running_at_end"]) > 0
                for r in runs[name]
            ),
        }
    base, this = summary["baseline"], summary["this"]
    summary["rate_ratio"] = round(this["rate"] / base["rate"], 2) if base["rate"] else None
    summary["p99_ratio"] = round(this["p99_ms"] / base["p99_ms"], 2) if base["p99_ms"] else None
    loads = [x for r in runs["baseline"] + runs["this"] for x in r["load_average"]]
    summary["load_average_range"] = [min(loads), max(loads)]
    return {"summary": summary, "runs": runs, "baseline_src": str(args.baseline_src)}


def stop_server(process: subprocess.Popen[bytes] | None) -> None:
    """Stop a server :func:`spawn_server` started: SIGTERM (a clean stop), killed if it
    has not exited within 60 s."""
    if process is None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m radserve.bench.load", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running server")
    parser.add_argument("--key", default=None, help="admin/submit key (or $RADSERVE_KEY)")
    parser.add_argument("--spawn", action="store_true", help="start a server for the run")
    parser.add_argument("--config", type=Path, default=None, help="config for --spawn")
    parser.add_argument(
        "--worker-nice", type=int, default=None, help="passed to `radserve serve` (--spawn)"
    )
    parser.add_argument("--study", type=Path, default=None, help="folder of DICOM files")
    parser.add_argument("--submissions", type=int, default=50)
    parser.add_argument("--submit-concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of reads")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="compare with a server from this src folder (another checkout), alternating",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the comparison")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure bare FastAPI/Starlette servers (alone, beside busy processes, "
        "with busy threads in-process) with the same generator, alternating (--spawn)",
    )
    parser.add_argument(
        "--read-processes",
        type=int,
        default=None,
        help="server.read_processes of the spawned server (default: the setting's, 'auto'; "
        "--floor: of the 'radserve readers' contestant, default 2)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        help="--floor: run only this contestant (repeat; e.g. 'radserve readers', 'bare "
        "FastAPI'); with --baseline-src each radserve layout also runs from that tree",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 unless targets are met")
    parser.add_argument("--min-rate", type=float, default=1000.0)
    parser.add_argument("--max-p99-ms", type=float, default=100.0)
    args = parser.parse_args(argv)
    if not 0 < args.duration <= 600:
        parser.error("--duration must be in (0, 600] seconds")
    if urlsplit(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the load test runs over loopback only")
    if args.baseline_src is not None and not (args.baseline_src / "radserve").is_dir():
        parser.error(f"--baseline-src {args.baseline_src}: no radserve package there")
    if args.baseline_src is not None and not args.spawn:
        parser.error("--baseline-src needs --spawn (it starts both servers)")
    if args.floor and (not args.spawn or args.check):
        parser.error("--floor needs --spawn, and not --check")
    if args.only and not args.floor:
        parser.error("--only chooses among --floor's contestants")
    if args.baseline_src is not None and args.check:
        parser.error("--check judges one server's run: not with --baseline-src")
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.floor:
        summary = result["summary"]
        ratios = summary["radserve_vs_floor"]
        print(
            "; ".join(
                f"{name} {summary[name]['rate']:.0f} req/s p99 {summary[name]['p99_ms']} ms"
                + (
                    f" (studies processing throughout: {summary[name]['processing_throughout']})"
                    if name in ratios
                    else " (" + ", ".join(f"{one} {ratios[one][name]}x" for one in ratios) + ")"
                )
                for name in summary["contestants"]
            )
            + f" (medians of {args.rounds}; load average {summary['load_average_range']})",
            file=sys.stderr,
        )
        return 0
    if "summary" in result:
        summary = result["summary"]
        base, this = summary["baseline"], summary["this"]
        print(
            f"baseline {base['rate']:.0f} req/s p99 {base['p99_ms']} ms; this tree "
            f"{this['rate']:.0f} req/s p99 {this['p99_ms']} ms: {summary['rate_ratio']}x the "
            f"rate (medians of {args.rounds}; load average {summary['load_average_range']})",
            file=sys.stderr,
        )
        return 0
    reads, submit = result["read"], result["submit"]
    ok = (
        submit["errors"] == 0
        and reads["errors"] == 0
        and reads["rate"] >= args.min_rate
        and reads["latency_ms"].get("p99", 1e9) <= args.max_p99_ms
    )
    print(
        f"submit: {submit['requests']} studies, {submit['errors']} errors; "
        f"read: {reads['rate']:.0f} req/s, p99 {reads['latency_ms'].get('p99')} ms, "
        f"{reads['errors']} errors -> {'targets met' if ok else 'targets NOT met'}",
        file=sys.stderr,
    )
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
