"""The load script's machinery against a real server, briefly (it measures nothing here:
speed is measured by running ``python -m radserve.bench.load``, not by tests)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from tests.factories.service import ServerThread, create_key, make_study, settings_for, wait_job

from radserve.api import create_app
from radserve.bench import load
from radserve.service import Service


def test_submissions_and_reads_over_loopback(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path))
    key = create_key(service.store, "submit")
    studies = load.distinct_copies(make_study(tmp_path / "template"), 4)
    assert len({blobs[0] for blobs in studies}) == 4  # new UIDs: four fingerprints
    with ServerThread(create_app(service)) as srv:
        submitted, ids = asyncio.run(load.submit_all(srv.url, key, studies, concurrency=4))
        assert (submitted.requests, submitted.errors, len(ids)) == (4, 0, 4)
        with httpx.Client(base_url=srv.url) as c:
            assert wait_job(c, ids[0], key)["state"] == "succeeded"
        paths = [f"/v1/jobs/{i}" for i in ids] + [f"/v1/jobs/{ids[0]}/report"]
        reads = asyncio.run(load.read_load(srv.url, key, paths, duration=0.5, connections=4))
    assert reads.requests > 0 and reads.errors == 0
    assert set(reads.latency_ms) == {"p50", "p90", "p99", "max", "mean"}


def test_only_loopback_is_loaded() -> None:
    with pytest.raises(SystemExit):
        load.main(["--url", "http://example.org:8000", "--duration", "1"])


def test_server_cpu_is_split_into_the_event_loop_thread_and_the_rest() -> None:
    import os
    import threading

    done = threading.Event()

    def spin() -> None:
        x = 0
        while not done.is_set():
            x += 1

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        before = load.thread_cpu_s(os.getpid())
        sum(i * i for i in range(2_000_000))  # CPU on this (the main) thread
        after = load.thread_cpu_s(os.getpid())
    finally:
        done.set()
        worker.join()
    assert after[0] > before[0] and after[1] > before[1]


def test_a_baseline_that_is_not_a_source_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        load.main(["--spawn", "--baseline-src", str(tmp_path), "--duration", "1"])


def test_the_floor_servers_answer_constant_bodies_of_radserve_sizes() -> None:
    from radserve.bench.load_floor import build_app, constant_json

    assert len(constant_json(12)) == 12 and len(constant_json(4321)) == 4321
    sizes = {"status": 700, "report": 5000}

    async def fetch(framework: str) -> list[httpx.Response]:
        app = build_app(framework, constant_json(sizes["status"]), constant_json(sizes["report"]))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://floor") as client:
            return [await client.get("/v1/jobs/j1"), await client.get("/v1/jobs/j1/report")]

    for framework in ("fastapi", "starlette"):
        status, report = asyncio.run(fetch(framework))
        assert (status.status_code, len(status.content)) == (200, 700)
        assert (report.status_code, len(report.content)) == (200, 5000)
        assert report.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("framework", "processes", "threads"), [("fastapi", False, True), ("starlette", True, False)]
)
def test_a_floor_read_phase_over_loopback(framework: str, processes: bool, threads: bool) -> None:
    import argparse

    args = argparse.Namespace(duration=0.5, connections=4, worker_nice=None)
    result = load.run_floor(
        args,
        framework,
        {"status": 600, "report": 3000},
        8,
        busy_processes=processes,
        busy_threads=threads,
    )
    assert result["read"]["requests"] > 0 and result["read"]["errors"] == 0
    assert result["busy_processes"] == (os.cpu_count() if processes else 0)
    assert result["busy_threads"] == (os.cpu_count() if threads else 0)
    assert result["server_cpu"]["event_loop_s"] >= 0


def test_the_floor_needs_a_spawned_server() -> None:
    with pytest.raises(SystemExit):
        load.main(["--floor", "--duration", "1"])
    with pytest.raises(SystemExit):
        load.main(["--floor", "--spawn", "--check", "--duration", "1"])
    with pytest.raises(SystemExit):  # --only picks among the floor run's contestants
        load.main(["--spawn", "--only", "bare FastAPI", "--duration", "1"])
