"""``radserve bench --scenario swap``: a hot swap of a model version under steady load.

Against a real server (``radserve serve`` spawned on a loopback port with a temporary
data dir, :func:`radserve.bench.load.spawn_server`):

1. a client submits ``n_studies`` distinct small phantom studies (fresh UIDs each, so
   none is answered from the cache), one every ``interval_s``, while ``readers``
   client threads keep reading the submitted jobs' status (each one read every
   ``read_interval_s``: a steady read load, not a flood that would starve the server);
2. after half the submissions, the admin API deploys another installed version of the
   swapped step as stable (``POST /v1/models/{step}/deploy``): the server loads and warms
   it, then new jobs resolve to it, while jobs in flight finish on the version they
   started with;
3. when every job has ended: failed requests (any non-2xx answer or transport error, of
   submissions, reads and the deploy), failed jobs, and each job's turnaround
   (``finished - arrival``) and service time (``finished - started``: without its wait
   in the queue). A job *straddles* the swap when it was running before the deploy
   answered and finished after the deploy was sent; ``added_latency_s`` is the largest
   straddling service time minus the median service time of the others (turnaround
   figures too, but they carry the queue: pick ``interval_s`` above a study's service
   time, or the queue grows and turnaround measures it).

The server and the client share the machine's cores; on a shared host the figures move
from run to run.
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from radserve.bench.errors import BenchError
from radserve.bench.load import distinct_copies, spawn_server, stop_server, template_study

STEP = "lesions"


def _other_version(client: httpx.Client, step: str, serving: str) -> str:
    """Another version of ``step`` this server may serve (gate accepted at fp32)."""
    rows = client.get("/v1/models").json()["versions"]
    candidates = [
        r["version"]
        for r in rows
        if r.get("name") == step
        and r.get("version") != serving
        and (r.get("gate") or {}).get("fp32") == "accepted"
    ]
    if not candidates:
        raise BenchError(f"no other servable version of {step} than {serving} is installed")
    return sorted(candidates)[-1]


def _time(value: str | None) -> float | None:
    return dt.datetime.fromisoformat(value).timestamp() if value else None


def run_swap_bench(
    *,
    n_studies: int = 12,
    interval_s: float = 4.0,
    readers: int = 4,
    read_interval_s: float = 0.05,
    step: str = STEP,
    timeout_s: float = 1800.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the scenario; returns the JSON summary."""
    if n_studies < 3:
        raise ValueError("the swap scenario needs at least 3 studies")
    workdir = Path(tempfile.mkdtemp(prefix="radserve-swap-"))
    process: subprocess.Popen[bytes] | None = None
    statuses: Counter[str] = Counter()
    lock = threading.Lock()

    def count(status: str) -> None:
        with lock:
            statuses[status] += 1

    try:
        log("starting a server (temporary data dir)")
        process, url, key = spawn_server(workdir / "data", None)
        headers = {"Authorization": f"Bearer {key}"}
        studies = distinct_copies(template_study(workdir / "template"), n_studies)
        ids: list[str] = []
        submitted_at: dict[str, float] = {}
        stop = threading.Event()

        def reader() -> None:
            with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
                k = 0
                while not stop.is_set():
                    with lock:
                        current = list(ids)
                    if not current:
                        stop.wait(0.05)
                        continue
                    job = current[k % len(current)]
                    k += 1
                    try:
                        r = c.get(f"/v1/jobs/{job}")
                        count(str(r.status_code))
                    except httpx.HTTPError as exc:
                        count(type(exc).__name__)
                    stop.wait(read_interval_s)

        threads = [threading.Thread(target=reader, daemon=True) for _ in range(readers)]
        for t in threads:
            t.start()
        swap: dict[str, Any] = {}
        with httpx.Client(base_url=url, headers=headers, timeout=300) as c:
            for n, blobs in enumerate(studies):
                if n == n_studies // 2:
                    first = c.get(f"/v1/jobs/{ids[0]}").json()
                    serving = first["model_versions"].get(step)
                    if serving is None:
                        raise BenchError(f"the default pipeline has no step {step!r}")
                    target = _other_version(c, step, serving)
                    log(f"deploying {step} {target} as stable (was {serving}) under load")
                    t0 = time.time()
                    r = c.post(
                        f"/v1/models/{step}/deploy",
                        json={"version": target, "role": "stable", "reason": "bench: hot swap"},
                    )
                    t1 = time.time()
                    count(str(r.status_code))
                    swap = {
                        "from": serving,
                        "to": target,
                        "deploy_status": r.status_code,
                        "deploy_seconds": t1 - t0,
                        "sent": t0,
                        "answered": t1,
                    }
                files = [
                    ("files", (f"{i}.dcm", b, "application/dicom")) for i, b in enumerate(blobs)
                ]
                t_submit = time.time()
                try:
                    r = c.post("/v1/studies", files=files)
                    count(str(r.status_code))
                    if r.status_code in (200, 202):
                        with lock:
                            ids.append(r.json()["id"])
                            submitted_at[ids[-1]] = t_submit
                except httpx.HTTPError as exc:
                    count(type(exc).__name__)
                log(f"submitted {n + 1}/{n_studies}")
                time.sleep(max(0.0, interval_s - (time.time() - t_submit)))
            deadline = time.monotonic() + timeout_s
            jobs: dict[str, dict[str, Any]] = {}
            while time.monotonic() < deadline:
                jobs = {j: c.get(f"/v1/jobs/{j}").json() for j in ids}
                if all(v["state"] in ("succeeded", "failed", "cancelled") for v in jobs.values()):
                    break
                time.sleep(1.0)
            else:
                raise BenchError(f"jobs did not finish within {timeout_s:.0f} s")
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        stop_server(process)
        shutil.rmtree(workdir, ignore_errors=True)

    failed_requests = sum(v for k, v in statuses.items() if k not in ("200", "201", "202"))
    rows = []
    for job_id, job in jobs.items():
        arrival, started = _time(job.get("arrival")), _time(job.get("started"))
        finished = _time(job.get("finished"))
        rows.append(
            {
                "id": job_id,
                "state": job["state"],
                "version": job["model_versions"].get(step),
                "turnaround_s": finished - arrival if arrival and finished else None,
                "service_s": finished - started if started and finished else None,
                "straddles_swap": bool(
                    started
                    and finished
                    and started <= swap["answered"]
                    and finished >= swap["sent"]
                ),
            }
        )

    def split(key: str) -> tuple[float | None, float | None]:
        inside = [r[key] for r in rows if r["straddles_swap"] and r[key] is not None]
        outside = [r[key] for r in rows if not r["straddles_swap"] and r[key] is not None]
        return (max(inside) if inside else None), (statistics.median(outside) if outside else None)

    worst, median_others = split("service_s")
    worst_tat, median_tat = split("turnaround_s")
    return {
        "studies": n_studies,
        "interval_s": interval_s,
        "readers": readers,
        "step": step,
        "swap": {k: v for k, v in swap.items() if k not in ("sent", "answered")},
        "requests": dict(statuses),
        "failed_requests": failed_requests,
        "failed_jobs": sum(r["state"] != "succeeded" for r in rows),
        "versions_served": dict(Counter(str(r["version"]) for r in rows)),
        "straddling_jobs": sum(r["straddles_swap"] for r in rows),
        "straddling_service_s": worst,
        "median_other_service_s": median_others,
        "added_latency_s": (worst - median_others)
        if worst is not None and median_others is not None
        else None,
        "straddling_turnaround_s": worst_tat,
        "median_other_turnaround_s": median_tat,
        "jobs": rows,
    }


__all__ = ["run_swap_bench"]
