"""Upload studies to a running server, follow their jobs, sample the GPU lines of /metrics.

Usage: serve_load.py KEY STUDY.zip... (the last one STAT, the rest OUTPATIENT), against
http://127.0.0.1:8765 (tools/device/gpu_serve_check.sh). Prints each job's state and
turnaround from its upload, the first job's runtime and stage timings, and /metrics'
GPU lines sampled while the jobs ran.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import httpx

BASE = "http://127.0.0.1:8765"


def main(key: str, studies: list[str]) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    samples: list[list[str]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            text = httpx.get(f"{BASE}/metrics", headers=headers, timeout=10).text
            lines = [ln for ln in text.splitlines() if "cuda" in ln and ln[:1] != "#"]
            samples.append(lines)
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    jobs = []
    for i, path in enumerate(studies):
        priority = "stat" if i == len(studies) - 1 else "outpatient"
        raw = Path(path).read_bytes()
        start = time.time()
        answer = httpx.post(
            f"{BASE}/v1/studies?priority={priority}",
            headers=headers,
            files={"files": ("study.zip", raw, "application/zip")},
            timeout=300,
        )
        print(path, priority, answer.status_code, answer.text[:300])
        if answer.status_code in (200, 202):
            body = answer.json()
            jobs.append((body["id"], start, priority))
    done: dict[str, tuple[str, float, str]] = {}
    deadline = time.time() + float(os.environ.get("SERVE_WAIT_S", "240"))
    while len(done) < len(jobs) and time.time() < deadline:
        for job_id, start, priority in jobs:
            if job_id in done:
                continue
            job = httpx.get(f"{BASE}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
            if job.get("state") in ("succeeded", "failed", "cancelled"):
                done[job_id] = (job["state"], round(time.time() - start, 2), priority)
        time.sleep(0.1)
    stop.set()
    for job_id, _, _ in jobs:
        print("job", job_id, done.get(job_id, "not finished"))
    report = httpx.get(f"{BASE}/v1/jobs/{jobs[0][0]}/report", headers=headers, timeout=10)
    body = report.json() if report.status_code == 200 else {}
    print("runtime", json.dumps(body.get("runtime"))[:1500])
    print("timings", json.dumps(body.get("timings") or body.get("stages"))[:2000])
    busy = [s for s in samples if s]
    print("metrics samples", len(samples), "with GPU lines", len(busy))
    for lines in busy[len(busy) // 2 : len(busy) // 2 + 1] + busy[-1:]:
        print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
