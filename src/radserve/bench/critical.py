"""``radserve bench --scenario critical``: how long a critical finding takes from the
moment a job's result exists to each receiver's acknowledgement, through a real server.

A server (:class:`~radserve.service.Service` + the HTTP API on uvicorn, loopback, a
temporary data dir, the bundled reference pipeline) gets three receivers on loopback — a
webhook, a TLS syslog collector (RFC 5425; a self-signed certificate made with the
``openssl`` command, plain TCP without it) and a FHIR endpoint (``kind: fhir``, which
is also ``fhir.url``, so each job's own Bundle goes there too) — and a site rule that makes
every liver lesion and lung nodule of 10 mm or more critical. ``n_studies`` distinct small
phantom studies are submitted over HTTP, ``concurrency`` at a time, so pushes happen while
other studies are being computed, as on a busy server.

Figures, from the outbox rows (``created`` is when the result existed, ``sent_at`` when
the receiver acknowledged): per receiver the median / p95 / max result -> acknowledgement
of every notice and of each study's first, how long the result took to be recorded (the
notices are held until then), and beside them, in the same run, the job's ordinary FHIR
Bundle delivery (result -> its 2xx), the path a critical finding took before it had its
own. The server and this
client share the host's cores; the summary records the load average before and after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from radserve.bench.errors import BenchError
from radserve.bench.eta_trace import _submit, _Uvicorn
from radserve.bench.load import distinct_copies, template_study
from radserve.bench.syslog_collector import Collector, make_certificate
from radserve.host import usable_cores

FINAL = ("succeeded", "failed", "cancelled")
LIMIT_S = 1.5  # the accreditation limit issue 17 quotes


class _Http:
    """A loopback HTTP receiver answering 200 to every POST (webhook and FHIR)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body = b'{"resourceType":"Bundle","type":"transaction-response","entry":[]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/fhir+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _certificate(folder: Path) -> tuple[Path, Path] | None:
    """The collector's certificate; None without a working ``openssl`` command."""
    try:
        return make_certificate(folder)
    except (OSError, subprocess.SubprocessError):
        return None


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    a = np.asarray(values)
    return {
        "n": len(values),
        "median_s": round(float(np.median(a)), 3),
        "p95_s": round(float(np.percentile(a, 95)), 3),
        "max_s": round(float(a.max()), 3),
        "within_limit": int((a <= LIMIT_S).sum()),
    }


def run_critical_bench(
    *,
    n_studies: int = 8,
    concurrency: int = 2,
    cpu_workers: int = 2,
    timeout_s: float = 900.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the scenario; returns the JSON summary."""
    from radserve.api import create_app
    from radserve.config import load_settings
    from radserve.service import Service
    from radserve.store.outbox import OutboxKind, OutboxStore

    if n_studies < 1 or concurrency < 1:
        raise ValueError("critical scenario: --studies >= 1")
    workdir = Path(tempfile.mkdtemp(prefix="radserve-critical-"))
    load_before = os.getloadavg()
    http, collector = _Http(), None
    try:
        log("writing small phantom studies (one template per seed, fresh UIDs per copy)")
        templates = [template_study(workdir / f"template-{s}", seed=s) for s in (1, 2)]
        per = -(-n_studies // len(templates))
        copies = [distinct_copies(list(t), per) for t in templates]
        studies = [copies[i % len(copies)].pop() for i in range(n_studies)]
        pem = _certificate(workdir)
        collector = Collector(0, *(pem or (None, None)))
        syslog: dict[str, Any] = {"name": "siem", "kind": "syslog", "host": "127.0.0.1",
                                  "port": collector.port}  # fmt: skip
        if pem is not None:
            syslog["tls"] = {"ca": str(pem[0])}
        else:
            syslog["transport"] = "tcp"
            log("no openssl command: the syslog receiver is plain TCP")
        settings = load_settings(
            None,
            data_dir=workdir / "data",
            fhir__url=f"{http.url}/fhir",
            critical__receivers=[
                {"name": "ward", "url": f"{http.url}/hook"},
                syslog,
                {"name": "ehr", "kind": "fhir", "flag": True},
            ],
            critical__rules=[
                {"label": "liver_lesion", "min_long_axis_mm": 10},
                {"label": "lung_nodule", "min_long_axis_mm": 10},
            ],
        )
        service = Service(settings, cpu_workers=cpu_workers, worker_nice=5)
        with _Uvicorn(create_app(service)) as server:
            _, key = service.store.create_api_key(name="bench critical", role="admin")
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=300
            ) as client:
                if not service.wait_warm(600):
                    raise BenchError("the server's models did not warm up")
                jobs = _run(client, studies, concurrency, timeout_s, log)
                rows = _wait_pushed(service, timeout_s)
            outbox = OutboxStore(service.store.engine)
            fhir_rows = outbox.items(kind=OutboxKind.FHIR)
        result_at: dict[str, Any] = {}
        per_receiver: dict[str, list[float]] = {}
        for row in rows:
            if row.job_id is not None:
                result_at[row.job_id] = min(result_at.get(row.job_id, row.created), row.created)
            if row.sent_at is not None:
                seconds = (row.sent_at - row.created).total_seconds()
                per_receiver.setdefault(row.destination.removeprefix("critical:"), []).append(
                    seconds
                )
        first: dict[str, dict[str, float]] = {}  # receiver -> job -> its first notice's s
        for row in rows:
            if row.sent_at is not None and row.job_id is not None:
                seconds = (row.sent_at - result_at[row.job_id]).total_seconds()
                per_job = first.setdefault(row.destination.removeprefix("critical:"), {})
                per_job[row.job_id] = min(per_job.get(row.job_id, seconds), seconds)
        failed = {}
        for job_id, state in jobs.items():
            record = service.store.get_job(job_id)
            if state != "succeeded" and record is not None:
                failed[job_id] = record.error_code
        held = []  # result -> recorded
        for job_id, at in result_at.items():
            record = service.store.get_job(job_id)
            if record is not None and record.finished is not None:
                held.append((record.finished - at).total_seconds())
        ordinary = [
            (r.sent_at - result_at[r.job_id]).total_seconds()
            for r in fhir_rows
            if r.sent_at is not None and r.job_id in result_at
        ]
    finally:
        http.close()
        if collector is not None:
            collector.close()
        shutil.rmtree(workdir, ignore_errors=True)
    findings = len({r.sop_instance_uid for r in rows})
    return {
        "scenario": "critical",
        "studies": n_studies,
        "succeeded": sum(j == "succeeded" for j in jobs.values()),
        "failed_error_codes": sorted(str(code) for code in failed.values()),
        "studies_with_critical_findings": len(result_at),
        "critical_findings": findings,
        "concurrency": concurrency,
        "cpu_workers": cpu_workers,
        "syslog_transport": "tls" if pem is not None else "tcp",
        "limit_s": LIMIT_S,
        "result_to_ack": {name: _stats(v) for name, v in sorted(per_receiver.items())},
        "first_notice_result_to_ack": {n: _stats(list(v.values())) for n, v in first.items()},
        "result_to_recorded": _stats(held),
        "job_fhir_bundle_result_to_ack": _stats(ordinary),
        "host": {
            "usable_cores": usable_cores(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
    }


def _run(
    client: httpx.Client,
    studies: list[list[bytes]],
    concurrency: int,
    timeout_s: float,
    log: Callable[[str], None],
) -> dict[str, str]:
    """Submit the studies, ``concurrency`` unfinished at a time; their final states."""
    pending = list(studies)
    running: list[str] = []
    states: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while pending or running:
        while pending and len(running) < concurrency:
            running.append(_submit(client, pending.pop(0), None))
        for job_id in list(running):
            state = client.get(f"/v1/jobs/{job_id}").json()["state"]
            if state in FINAL:
                running.remove(job_id)
                states[job_id] = state
                log(f"job {len(states)}/{len(studies)}: {state}")
        if time.monotonic() > deadline:
            raise BenchError(f"jobs did not finish within {timeout_s:.0f} s")
        time.sleep(0.1)
    return states


def _wait_pushed(service: Any, timeout_s: float) -> list[Any]:
    """The critical rows once every one is acknowledged (or the time is up)."""
    from radserve.store.outbox import OutboxKind, OutboxState, OutboxStore

    store = OutboxStore(service.store.engine)
    deadline = time.monotonic() + timeout_s
    while True:
        rows = store.items(kind=OutboxKind.CRITICAL)
        if all(r.state == OutboxState.SENT for r in rows) or time.monotonic() > deadline:
            fhir = store.items(kind=OutboxKind.FHIR)
            if all(r.state == OutboxState.SENT for r in fhir) or time.monotonic() > deadline:
                return rows
        time.sleep(0.2)


__all__ = ["run_critical_bench"]
