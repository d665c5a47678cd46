"""The service on the Ray executor, against a real local Ray (two CPU "devices").

Same end-to-end checks as the in-process executor (submit -> result, URGENT overtaking
routine work, cancellation, exactly one result per job), plus the worker faults: a
worker process killed mid-batch, and one that hangs (SIGSTOP) past its batch timeout.
Ray is started once for the module (``ray.init(num_cpus=2)``) and shared by the tests;
the executor uses a Ray already running in its process.
"""

from __future__ import annotations

import collections
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_models_slow,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import until

from radserve.api import create_app
from radserve.inference import SessionRef
from radserve.scheduling import JobState
from radserve.scheduling.ray_executor import RayExecutor
from radserve.service import Service

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

SLOW_GRID = {
    "n_slices": 24,
    "rows": 128,
    "cols": 128,
    "spacing": (2.0, 1.5, 1.5),
    "background": -100.0,
}


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace="radserve-test",
        object_store_memory=128 * 1024**2,
    )
    yield
    ray.shutdown()


def ray_service(root: Path, *, slow: bool = True, **overrides: Any) -> Service:
    values: dict[str, Any] = {
        "executor": "ray",
        "ray__devices": ["cpu:1", "cpu:1"],
        "scheduler__max_batch_size": 2,
        **overrides,
    }
    settings = settings_for(root, **values)
    if slow:
        make_models_slow(root / "assets" / "models", layers=4, channels=32)
    return Service(settings, cpu_workers=1)


def count_successes(service: Service) -> collections.Counter[str]:
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


def test_submit_to_result_on_two_cpu_workers(tmp_path: Path) -> None:
    service = ray_service(tmp_path, slow=False)
    successes = count_successes(service)
    key = create_key(service.store, "submit")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        ids = [
            c.post(
                "/v1/studies", files=upload(make_study(tmp_path / f"s{i}")), headers=auth(key)
            ).json()["id"]
            for i in range(4)
        ]
        jobs = [wait_job(c, job_id, key, timeout=120) for job_id in ids]
        assert [j["state"] for j in jobs] == ["succeeded"] * 4, jobs
        report = c.get(f"/v1/jobs/{ids[0]}/report", headers=auth(key))
        assert report.status_code == 200 and report.json()["findings"], report.text[:300]
        stats = executor(service).stats()
    assert {s["worker"] for s in stats} == {"ray-cpu0", "ray-cpu1"}
    assert all(s["batches"] > 0 for s in stats), stats  # both devices used
    assert len({s["pid"] for s in stats} | {os.getpid()}) == 3  # two actor processes
    assert all(s["threads"] == 1 for s in stats)  # each session on its slot's thread budget
    assert dict(successes) == dict.fromkeys(ids, 1)


def test_urgent_overtakes_routine_work_and_cancel_stops_a_job(tmp_path: Path) -> None:
    # one routine job at a time, so the later routine jobs are still queued when the URGENT
    # study arrives (with room for more, they may have started, and be near their end)
    service = ray_service(tmp_path, jobs__max_retries=0, scheduler__max_running=1)
    successes = count_successes(service)
    key = create_key(service.store, "submit")
    urgent_study = upload(make_study(tmp_path / "u", **SLOW_GRID))  # ready before the wait
    routine_studies = [upload(make_study(tmp_path / f"r{i}", **SLOW_GRID)) for i in range(4)]
    # The timing is the scheduler's own hold (what a server does when it cannot prove it
    # holds its jobs: no new unit handed out, running units finish), not the host's speed:
    # on a fast host the first routine job ended while the third was uploading, and the
    # wait for it to run never ended (a CI run)
    scheduler = service.scheduler
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:

        def state(job_id: str) -> str:
            return str(c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()["state"])

        scheduler.hold("test", "the routine studies arrive")
        routine = [
            c.post("/v1/studies", files=files, headers=auth(key)).json()["id"]
            for files in routine_studies
        ]
        scheduler.release()
        until(lambda: state(routine[0]) not in ("received", "queued"), "a routine job to start")
        scheduler.hold("test", "the URGENT study arrives")
        waiting = [j for j in routine if state(j) in ("received", "queued")]
        # the first one started, handed out before the URGENT study arrived and not taken
        # back; two at least still wait (one at a time, each job takes seconds of stages)
        assert routine[0] not in waiting and len(waiting) >= 2 and routine[-1] in waiting
        urgent = c.post(
            "/v1/studies", params={"priority": "urgent"}, files=urgent_study, headers=auth(key)
        ).json()["id"]
        assert c.delete(f"/v1/jobs/{routine[-1]}", headers=auth(key)).status_code == 202
        scheduler.release()
        done = {j: wait_job(c, j, key, timeout=240) for j in [urgent, *routine]}
    assert done[urgent]["state"] == "succeeded"
    assert done[routine[-1]]["state"] == "cancelled"
    assert done[routine[-1]]["error"]["code"] == "job_cancelled"
    finished = {j: service.store.get_job(j).finished for j in done}
    # every routine job still queued when it arrived ends after it
    assert all(finished[urgent] < finished[j] for j in waiting if j != routine[-1])
    assert dict(successes) == {urgent: 1, **dict.fromkeys(routine[:-1], 1)}
    assert service.store.get_job(routine[-1]).result_path is None


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_lost_worker_s_batch_runs_on_another_and_the_job_has_one_result(
    tmp_path: Path, fault: str
) -> None:
    """SIGKILL: the actor process dies mid-batch; SIGSTOP: it hangs past the batch timeout
    and is killed by the executor. Either way Ray restarts it, the batch runs again on a
    worker, and the study ends with exactly one result."""
    service = ray_service(tmp_path, ray__batch_timeout_s=5.0, ray__max_restarts=2)
    successes = count_successes(service)
    key = create_key(service.store, "submit")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        job_id = c.post(
            "/v1/studies",
            files=upload(make_study(tmp_path / "s", **SLOW_GRID)),
            headers=auth(key),
        ).json()["id"]
        ex = executor(service)
        victim = ex.workers[0]
        old_pid = victim.pid
        until(lambda: victim.current is not None, "a batch on the victim worker")
        os.kill(old_pid, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        job = wait_job(c, job_id, key, timeout=240)
        assert job["state"] == "succeeded", job
        until(lambda: victim.pid != old_pid, "Ray to restart the worker", 120)  # restarted by Ray
        # ... and it loads the warmed-up models again before its next batch
        until(
            lambda: victim.loaded == set(ex.warmed) != set(),
            "the restarted worker to load the warmed models",
            120,
        )
        assert ray.get(victim.actor.ping.remote())["sessions"]
    assert victim.lost >= 1 and ex.requeued >= 1
    assert ex.workers[1].batches > 0  # the other worker carried on
    assert dict(successes) == {job_id: 1}
    if fault == "hung":  # the stopped process was killed, not left behind
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)


def test_workers_load_their_sessions_at_start_and_readiness_waits_for_them(
    tmp_path: Path,
) -> None:
    """Warm-up loads and runs each model on every worker actor before /readyz says
    ready (not at the first batch); the serving process loads no session itself."""
    service = ray_service(tmp_path, slow=False)
    key = create_key(service.store, "submit")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        until(
            lambda: c.get("/readyz", headers=auth(key)).status_code == 200,
            "/readyz to say ready",
            120,
        )
        ex = executor(service)
        loaded = [ray.get(w.actor.ping.remote())["sessions"] for w in ex.workers]
        assert all(s["batches"] == 0 for s in ex.stats())  # no study has run
        resolved = service.catalog.resolve()
        expected = sorted(
            f"{service.catalog.registry.get(s.model, s.version).onnx_path(resolved.precision).name}"
            f"/{resolved.precision}"
            for s in resolved.spec.steps
        )
        assert loaded == [expected, expected], loaded
        for step in resolved.spec.steps:
            bundle = service.catalog.registry.get(step.model, step.version)
            assert isinstance(service.catalog.sessions.get(bundle, resolved.precision), SessionRef)
        job_id = c.post(
            "/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(key)
        ).json()["id"]
        assert wait_job(c, job_id, key, timeout=120)["state"] == "succeeded"
