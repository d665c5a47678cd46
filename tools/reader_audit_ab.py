"""The API readers' audit path alone, without HTTP: each reader's own group-commit writer
thread (``own``, before) against one audit writer process for all readers (``writer``,
:mod:`radserve.api.audit_writer`), alternating in one run.

    PYTHONPATH=src python tools/reader_audit_ab.py --readers 2 --tasks 16 --rounds 3

Each round starts ``--readers`` processes, each an event loop with ``--tasks`` tasks that
do what a reader's connections do: a status read (``--work-us`` of Python on the loop),
then a report read (the same work, then its ``phi.read`` record committed before it
"answers"), for ``--duration`` seconds, on a real keyed SQLite store with the server's
settings (WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE``). Printed per mode: report
reads/s, their latency p50/p99, and the CPU-ms per report read of all processes (the
readers and, for ``writer``, the writer process), medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from radserve.api.audit_writer import AuditWriterClient, serve_audit_writer
from radserve.audit import AuditEvent
from radserve.config import Settings, load_settings
from radserve.store.audited import open_audited


def _spin(us: float) -> None:
    end = time.thread_time() + us / 1e6
    while time.thread_time() < end:
        pass


def reader(settings: Settings, mode: str, path: str, args: dict[str, Any], out: Any) -> None:
    store, trail = open_audited(settings)
    trail.start()
    latencies: list[float] = []

    async def main() -> None:
        client = AuditWriterClient(path) if mode == "writer" else None
        submit = client.submit if client is not None else store.submit_audit
        deadline = time.perf_counter() + args["duration"]

        async def task(t: int) -> None:
            i = 0
            while time.perf_counter() < deadline:
                _spin(args["work_us"])  # a status read
                await asyncio.sleep(0)
                t0 = time.perf_counter()
                _spin(args["work_us"])
                event = AuditEvent(
                    "phi.read", f"job-{os.getpid()}-{t}-{i}", {"resource": "report"}, "key"
                )
                await asyncio.wrap_future(submit(event))
                latencies.append(time.perf_counter() - t0)
                i += 1

        await asyncio.gather(*(task(t) for t in range(args["tasks"])))
        if client is not None:
            client.close()

    cpu0 = time.process_time()
    asyncio.run(main())
    trail.stop()
    store.close()
    out.send((latencies, time.process_time() - cpu0))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(mode: str, args: argparse.Namespace) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="reader-audit-ab-") as folder:
        settings = load_settings(None, data_dir=str(Path(folder) / "data"))
        settings.data_dir.mkdir(parents=True)
        open_audited(settings)[0].close()  # the schema, once
        path = str(Path(folder) / "audit.sock")
        writer, writer_cpu0 = None, 0.0
        if mode == "writer":
            mine, theirs = context.Pipe(duplex=True)
            writer = context.Process(
                target=serve_audit_writer, args=(settings, path, theirs, logging.INFO, False)
            )
            writer.start()
            assert mine.poll(60) and mine.recv() == "ready"
            assert writer.pid is not None
            writer_cpu0 = _cpu_s(writer.pid)  # not its start (imports, schema check)
        pipes, procs = [], []
        options = {"duration": args.duration, "tasks": args.tasks, "work_us": args.work_us}
        for _ in range(args.readers):
            receive, send = context.Pipe(duplex=False)
            proc = context.Process(target=reader, args=(settings, mode, path, options, send))
            proc.start()
            pipes.append(receive)
            procs.append(proc)
        results = [p.recv() for p in pipes]
        for proc in procs:
            proc.join(30)
        writer_cpu = 0.0
        if writer is not None and writer.pid is not None:
            writer_cpu = _cpu_s(writer.pid) - writer_cpu0
            writer.terminate()
            writer.join(30)
    latencies = sorted(t for lat, _ in results for t in lat)
    reads = len(latencies)
    cpu = sum(c for _, c in results) + writer_cpu
    return {
        "reads_per_s": round(reads / args.duration, 1),
        "p50_ms": round(1000 * latencies[reads // 2], 2),
        "p99_ms": round(1000 * latencies[int(0.99 * reads)], 2),
        "cpu_ms_per_read": round(1000 * cpu / reads, 3),
        "writer_cpu_ms_per_read": round(1000 * writer_cpu / reads, 3),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--work-us", type=float, default=250.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"own": [], "writer": []}
    for i in range(args.rounds):
        for mode in ("own", "writer") if i % 2 == 0 else ("writer", "own"):
            result = one_round(mode, args)
            runs[mode].append(result)
            print(f"round {i + 1} {mode}: {json.dumps(result)}", flush=True)
    summary = {
        mode: {k: statistics.median(r[k] for r in cells) for k in cells[0]}
        for mode, cells in runs.items()
    }
    print(json.dumps({"summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
