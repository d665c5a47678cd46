"""The audit step of a patient-data read, alone: one commit per read against group commit.

Every report/FHIR/label/key-image read appends a ``phi.read`` record before it is
answered. This measures that step without HTTP, in one process, on a real store (a
SQLite file with the server's settings: WAL, ``synchronous=FULL``): ``--tasks``
asyncio tasks, as an event loop serving that many keep-alive connections would, each
auditing ``--reads`` reads, either

- ``per_read``: each append its own transaction, reached through a worker thread
  (``run_in_threadpool(store.append_audit, ...)``: the server before group commit), or
- ``grouped``: :meth:`Store.submit_audit` (one writer thread, one commit per batch),

alternately, ``--rounds`` times. It prints reads per second, process CPU-ms per read
(user + system, all threads) and commits made, per mode, and the chain is verified
at the end::

    python -m radserve.bench.audit_reads --tasks 32 --reads 50 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from radserve.audit.chain import AuditEvent, AuditKey
from radserve.audit.events import Action
from radserve.store import Store, init_store


def read_event(task: int) -> AuditEvent:
    return AuditEvent(
        action=Action.PHI_READ,
        subject=f"job-{task}",
        payload={"resource": "report", "key_name": "load"},
        actor_key_id="k1",
        client_address="127.0.0.1",
    )


async def _per_read(store: Store, task: int, reads: int) -> None:
    for _ in range(reads):
        await run_in_threadpool(store.append_audit, read_event(task))


async def _grouped(store: Store, task: int, reads: int) -> None:
    for _ in range(reads):
        await asyncio.wrap_future(store.submit_audit(read_event(task)))


async def _one(store: Store, mode: str, tasks: int, reads: int) -> dict[str, Any]:
    body = _per_read if mode == "per_read" else _grouped
    head0 = store.audit_head()[0]
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(body(store, t, reads) for t in range(tasks)))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = tasks * reads
    assert store.audit_head()[0] - head0 == n, "every read must be audited once"
    return {"reads_per_s": round(n / seconds, 1), "cpu_ms_per_read": round(cpu * 1000 / n, 3)}


def run(tasks: int, reads: int, rounds: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="radserve-audit-bench-"))
    key = AuditKey(os.urandom(32))  # keyed like the server's chain (HMAC per record)
    store = init_store(f"sqlite:///{folder / 'radserve.db'}", audit_key=key)
    results: dict[str, list[dict[str, Any]]] = {"per_read": [], "grouped": []}
    try:
        for r in range(rounds):
            modes = ["per_read", "grouped"] if r % 2 == 0 else ["grouped", "per_read"]
            for mode in modes:
                batcher_commits = _commits(store)
                result = asyncio.run(_one(store, mode, tasks, reads))
                if mode == "grouped":
                    result["commits"] = _commits(store) - batcher_commits
                else:
                    result["commits"] = tasks * reads
                results[mode].append(result)
                print(f"round {r + 1} {mode}: {result}", file=sys.stderr)
        assert store.verify_audit().ok
    finally:
        store.close()
    summary = {
        mode: {
            k: statistics.median(x[k] for x in runs)
            for k in ("reads_per_s", "cpu_ms_per_read", "commits")
        }
        for mode, runs in results.items()
    }
    base, new = summary["per_read"], summary["grouped"]
    summary["rate_ratio"] = round(new["reads_per_s"] / base["reads_per_s"], 2)
    summary["cpu_ratio"] = round(new["cpu_ms_per_read"] / base["cpu_ms_per_read"], 2)
    return {"tasks": tasks, "reads_per_task": reads, "summary": summary, "runs": results}


def _commits(store: Store) -> int:
    batcher = store._audit_batcher
    return batcher.batches if batcher is not None else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m radserve.bench.audit_reads", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=32, help="concurrent readers")
    parser.add_argument("--reads", type=int, default=50, help="reads per reader")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = run(args.tasks, args.reads, args.rounds)
    print(json.dumps(result, indent=2))
    s = result["summary"]
    print(
        f"per_read {s['per_read']['reads_per_s']:.0f} reads/s, grouped "
        f"{s['grouped']['reads_per_s']:.0f} reads/s ({s['rate_ratio']}x); CPU per read "
        f"{s['cpu_ratio']}x; commits {s['per_read']['commits']:.0f} vs "
        f"{s['grouped']['commits']:.0f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
