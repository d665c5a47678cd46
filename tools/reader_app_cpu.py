"""A reader process's own CPU per status and report read, without sockets or uvicorn.

    PYTHONPATH=src python tools/reader_app_cpu.py --requests 20000
    PYTHONPATH=src python tools/reader_app_cpu.py --baseline-src /tmp/rs-main/src  # A/B

Why: on a shared two-core host the load bench's rates move 2x between rounds, so a cut
of a few percent in the reader's own code cannot be told from noise there. This calls
the real reader ASGI app (:func:`radserve.api.reader.reader_app`: middlewares, key check,
routes, the ``phi.read`` audit record committed to a real SQLite store) directly, 32
requests in flight as in the load bench, and reads the event-loop thread's CPU clock:
the audit commits run in the store's own writer thread and are not counted (in the
server they run in the audit writer process). With
``--baseline-src`` the same measurement runs alternately in a child process on that
source tree, so the ratio comes from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_CONCURRENT = 32  # requests in flight, as the load bench's connections


def _measure(requests: int) -> dict[str, float]:
    from radserve.api.job_snapshot import SnapshotReader, SnapshotWriter
    from radserve.api.reader import reader_app
    from radserve.config import load_settings
    from radserve.domain.jobs import JobState
    from radserve.domain.priority import PriorityClass
    from radserve.service.jobcache import JobCache
    from radserve.service.jobs import JobAccess
    from radserve.store import JobRecord, init_store

    tmp = Path(tempfile.mkdtemp(prefix="reader-app-cpu-"))
    store = init_store(f"sqlite:///{tmp / 'radserve.db'}")
    _, key = store.create_api_key(name="poller", role="read")
    result = tmp / "result"
    result.mkdir()
    (result / "report.json").write_bytes(json.dumps({"pad": "x" * 110_000}).encode())
    t0 = dt.datetime.now(dt.UTC)
    cache = JobCache()
    for index, state in enumerate((JobState.RUNNING, JobState.SUCCEEDED)):
        cache.put(
            JobRecord(
                id=f"job-{index}",
                state=state,
                priority_class=PriorityClass.OUTPATIENT,
                arrival=t0,
                deadline=t0 + dt.timedelta(hours=1),
                pipeline_name="ct-organs",
                pipeline_version="1",
                precision="fp32",
                fingerprint="f" * 64,
                study_path="/nowhere",
                started=t0,
                finished=t0 if state is JobState.SUCCEEDED else None,
                updated=t0,
                result_path=str(result) if state is JobState.SUCCEEDED else None,
            )
        )
    snapshot = tmp / "jobs.snapshot"
    jobs = JobAccess(store, cache, scheduler=None, hooks=None)  # type: ignore[arg-type]
    SnapshotWriter(jobs, cache, snapshot).write()
    settings = load_settings(None, data_dir=tmp / "data")

    async def upstream(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a keyed read must not be forwarded")

    app = reader_app(settings, store, SnapshotReader(snapshot), upstream, lambda e: None)
    header = [(b"host", b"reader"), (b"authorization", f"Bearer {key}".encode())]

    def scope(path: str) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": header,
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def run(path: str, n: int) -> float:
        statuses: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        t = time.thread_time()
        for _ in range(n // _CONCURRENT):  # one task a request, as uvicorn runs them
            await asyncio.gather(*(app(scope(path), receive, send) for _ in range(_CONCURRENT)))
        spent = time.thread_time() - t
        assert set(statuses) == {200}, statuses[:5]
        return spent / (n // _CONCURRENT * _CONCURRENT) * 1e6

    async def main() -> dict[str, float]:
        await run("/v1/jobs/job-0", 200)  # warm: key check, bodies, report cache
        await run("/v1/jobs/job-1/report", 200)
        return {
            "status_us": await run("/v1/jobs/job-0", requests),
            "report_us": await run("/v1/jobs/job-1/report", requests),
        }

    try:
        return asyncio.run(main())
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="of each kind, a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.requests)))
        return 0
    trees = {"this tree": str(Path(__file__).resolve().parents[1] / "src")}
    if args.baseline_src is not None:
        trees = {"baseline": str(args.baseline_src.resolve()), **trees}
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            env = {**os.environ, "PYTHONPATH": src}
            command = [sys.executable, __file__, "--child", "--requests", str(args.requests)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
            seen[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {
        name: {
            kind: round(statistics.median(r[kind] for r in rounds), 1)
            for kind in ("status_us", "report_us")
        }
        | {"rounds": [{k: round(v, 1) for k, v in r.items()} for r in rounds]}
        for name, rounds in seen.items()
    }
    if args.baseline_src is not None:
        for kind in ("status_us", "report_us"):
            summary[f"this tree / baseline, {kind}"] = round(
                summary["this tree"][kind] / summary["baseline"][kind], 3
            )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
