"""Ray device workers lost again and again, against a real local Ray (two CPU slots).

- A study whose batch kills every worker that runs it (an input that runs a worker out
  of memory, or crashes the runtime) fails with ``batch_lost`` once its batch has been
  lost ``MAX_BATCH_LOSSES`` times; the other studies finish, each with one result.
  Before, the lost batch went round the workers for ever, each running it before any
  other work: the job never ended, not even at its timeout.
- A worker that is lost and cannot come back (its slot's resources taken) is named by
  ``/readyz`` (degraded; not ready once every worker is lost) and ``/metrics``
  (``radserve_ray_worker_up`` 0); it is back in both once Ray can place it again, and
  the study that waited meanwhile has one result. Before, ``/readyz`` said ready and
  nothing in ``/metrics`` told a lost worker. While every worker is lost, the job's
  status has no ETA and names what it waits for (``waiting_for``: no_device_worker);
  before, it showed an ETA as if its batches ran.
- A Ray head that does not answer stops ``radserve serve`` after ``ray.startup_timeout_s``
  with the reason, instead of a server that waited for ever (``ray.init`` retries) and
  ignored SIGTERM.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.server_process import run_radserve
from tests.factories.service import (
    ServerThread,
    auth,
    config_file,
    create_key,
    make_models_slow,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import until

from radserve.api import create_app
from radserve.scheduling import JobState, ray_executor
from radserve.scheduling.ray_executor import RayExecutor
from radserve.service import Service

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

GRID = {"n_slices": 24, "rows": 128, "cols": 128, "spacing": (2.0, 1.5, 1.5)}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace="radserve-test-faults",
        object_store_memory=128 * 1024**2,
    )
    yield
    ray.shutdown()


def ray_service(root: Path, **overrides: Any) -> Service:
    settings = settings_for(
        root,
        executor="ray",
        ray__devices=["cpu:1", "cpu:1"],
        scheduler__max_batch_size=2,
        **overrides,
    )
    make_models_slow(root / "assets" / "models", layers=6, channels=48)
    return Service(settings, cpu_workers=1)


def successes(service: Service) -> collections.Counter[str]:
    """SUCCEEDED events per job, as the scheduler reports them to the service."""
    seen: collections.Counter[str] = collections.Counter()
    forward = service.hooks.on_state

    def on_state(event: Any) -> None:
        if event.state is JobState.SUCCEEDED:
            seen[event.job_id] += 1
        forward(event)

    service.hooks.on_state = on_state  # type: ignore[method-assign]
    return seen


def executor(service: Service) -> RayExecutor:
    assert isinstance(service.executor, RayExecutor)
    return service.executor


class Killer(threading.Thread):
    """SIGKILLs whichever worker process runs a batch of job ``victim`` (the study that
    takes its worker down with it), until stopped."""

    def __init__(self, ex: RayExecutor) -> None:
        super().__init__(daemon=True)
        self.ex = ex
        self.victim: str | None = None
        self.kills = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.002):
            for worker in self.ex.workers:
                batch, pid = worker.current, worker.pid
                if batch is None or not any(p.job_id == self.victim for p in batch.parts):
                    continue
                if worker.current is batch:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.kills += 1
                    except ProcessLookupError:
                        pass


@pytest.mark.slow
@pytest.mark.usefixtures("local_ray")
def test_a_study_that_kills_every_worker_fails_and_the_others_finish(tmp_path: Path) -> None:
    service = ray_service(tmp_path, ray__max_restarts=20)
    done = successes(service)
    key = create_key(service.store, "submit")
    studies = [upload(make_study(tmp_path / f"s{i}", background=-100.0, **GRID)) for i in range(3)]
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        until(lambda: c.get("/readyz", headers=auth(key)).status_code == 200, "ready", 120)
        ex = executor(service)
        killer = Killer(ex)
        service.scheduler.hold("test", "the studies arrive")
        ids = [c.post("/v1/studies", files=s, headers=auth(key)).json()["id"] for s in studies]
        killer.victim = ids[1]
        killer.start()
        service.scheduler.release()
        try:
            jobs = {j: wait_job(c, j, key, timeout=180) for j in ids}
        finally:
            killer.done.set()
            killer.join()
        metrics = c.get("/metrics").text
    poisoned = jobs.pop(ids[1])
    assert poisoned["state"] == "failed", poisoned
    assert poisoned["error"]["code"] == "batch_lost", poisoned
    assert {j["state"] for j in jobs.values()} == {"succeeded"}, jobs
    assert dict(done) == dict.fromkeys(jobs, 1)
    assert killer.kills >= ray_executor.MAX_BATCH_LOSSES
    # each of its batches in flight then (one per worker, at most) was failed
    assert 1 <= ex.failed_batches <= len(ex.workers)
    assert f"radserve_ray_batches_failed_total {float(ex.failed_batches)}" in metrics


@ray.remote(num_cpus=1)
class Placeholder:
    """Holds one CPU of the local Ray, so a lost worker's replacement cannot start."""

    def ping(self) -> int:
        return os.getpid()


def _metric(text: str, line_start: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.slow
@pytest.mark.usefixtures("local_ray")
def test_lost_workers_show_in_readiness_and_metrics_until_they_are_back(tmp_path: Path) -> None:
    # long enough for a loaded 2-core host to start the workers, short enough that a
    # replacement waiting for a CPU gives up and is tried again within the waits below
    service = ray_service(tmp_path, ray__max_restarts=0, ray__startup_timeout_s=15.0)
    done = successes(service)
    key = create_key(service.store, "submit")
    study = upload(make_study(tmp_path / "s", background=-100.0, **GRID))
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        until(lambda: c.get("/readyz", headers=auth(key)).status_code == 200, "ready", 120)
        ex = executor(service)
        # both worker processes die (no restart: max_restarts 0) and their CPUs are taken
        for worker in ex.workers:
            os.kill(worker.pid, signal.SIGKILL)
        holders = [Placeholder.remote() for _ in ex.workers]
        until(lambda: ray.get([h.ping.remote() for h in holders], timeout=60), "the holders")
        job_id = c.post("/v1/studies", files=study, headers=auth(key)).json()["id"]

        def seen_down() -> dict[str, Any] | None:
            ready = c.get("/readyz", headers=auth(key))
            body = ready.json()
            lost = [r for r in body["reasons"] if r.startswith("device worker")]
            return body if ready.status_code == 503 and len(lost) == 2 else None

        body = until(seen_down, "/readyz to name both lost workers", 120)
        assert body["ready"] is False and body["degraded"] is True, body
        metrics = c.get("/metrics").text
        assert _metric(metrics, 'radserve_ray_worker_up{worker="ray-cpu0"}') == 0.0
        assert _metric(metrics, 'radserve_ray_worker_up{worker="ray-cpu1"}') == 0.0
        assert (_metric(metrics, 'radserve_ray_worker_down_seconds{worker="ray-cpu0"}') or 0) > 0
        # the job waits, and says so: no ETA as if its batches ran (before: an ETA, and
        # nothing told it from a job whose work goes on)
        job = c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
        assert job["state"] in ("queued", "running"), job
        assert job["eta"] is None, job
        waiting = job["waiting_for"]
        assert waiting is not None and waiting["reason"] == "no_device_worker", job
        assert "no Ray worker is alive" in waiting["message"], waiting
        assert "ray-cpu0" in waiting["message"] and "ray-cpu1" in waiting["message"]
        listed = c.get("/v1/jobs", headers=auth(key)).json()["items"]
        assert [j["waiting_for"]["reason"] for j in listed if j["id"] == job_id] == [
            "no_device_worker"
        ]

        ray.kill(holders[0])  # one slot free: one worker back, ready again but degraded

        def one_back() -> dict[str, Any] | None:
            ready = c.get("/readyz", headers=auth(key))
            body = ready.json()
            lost = [r for r in body["reasons"] if r.startswith("device worker")]
            return body if ready.status_code == 200 and len(lost) == 1 else None

        body = until(one_back, "one worker back", 120)
        assert body["degraded"] is True, body
        job = c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
        assert job["waiting_for"] is None, job
        assert wait_job(c, job_id, key, timeout=180)["state"] == "succeeded"
        ray.kill(holders[1])
        until(
            lambda: not c.get("/readyz", headers=auth(key)).json()["reasons"],
            "every worker back",
            120,
        )
        metrics = c.get("/metrics").text
        assert _metric(metrics, 'radserve_ray_worker_up{worker="ray-cpu1"}') == 1.0
        lost = [
            _metric(metrics, f'radserve_ray_batches_lost_total{{worker="{w.slot.name}"}}')
            for w in ex.workers
        ]
        assert sum(n or 0 for n in lost) >= 1, lost
    assert dict(done) == {job_id: 1}


@pytest.mark.slow
def test_serve_stops_with_the_reason_when_the_ray_head_does_not_answer(tmp_path: Path) -> None:
    # nothing listens on this port: ray.init retried it for ever
    config = config_file(
        tmp_path,
        executor="ray",
        ray={"address": f"127.0.0.1:{free_port()}", "startup_timeout_s": 5},
    )
    data = tmp_path / "data"
    served = run_radserve(
        "serve", "--port", "0", "--config", str(config), "--data-dir", str(data), timeout=240
    )
    output = served.stdout + served.stderr
    assert served.returncode != 0
    assert "did not answer within 5 s (ray.startup_timeout_s)" in output, output[-3000:]
