"""``radserve bench --scenario eta``: ETA accuracy and the planner's prediction, measured
on a mixed-class stream of phantom studies through a real server in this process.

1. A server (:class:`~radserve.service.Service` + the HTTP API on uvicorn, loopback, a
   temporary data dir) is started; one warm-up study per template size is run alone, so
   the service-time model has measured something and the mean service time is known.
2. ``n_studies`` distinct studies (fresh UIDs: none is answered from the cache) are
   submitted over HTTP with a class drawn from ``mix`` (URGENT, INPATIENT, OUTPATIENT):
   ``burst`` at once, then Poisson arrivals at ``load`` x the warm-up service rate, so a
   queue forms. Right after each 202 the job's ETA is read (``GET /v1/jobs/{id}``: the
   ETA *at submission*), and a poller reads every unfinished job's ETA from
   ``GET /v1/jobs`` every ``poll_s`` (the first reading while running is the ETA *at
   start*; the one nearest the middle of its turnaround, *halfway*).
3. When all have finished (*the stream*), a burst of URGENT studies beyond capacity
   (``miss_burst``: a mass-casualty morning): as many at once as take ``MISS_LOAD`` x the
   URGENT TAT of work at the warm-up service time (at most ``miss_burst_max``), so
   deadlines are missed and "how many misses a risk event announced, and how early"
   has a figure. The stream's figures below do not include the burst's jobs.
4. ETA errors of the stream (radserve.bench.eta_accuracy), the deadline misses (stream
   and burst) and how many a risk event announced (``GET /v1/ops/turnaround``), and
   ``radserve plan``'s simulation of the same arrivals against the measured per-class
   p50/p95 turnaround: as ``radserve plan`` runs by default (``planner``: on a CPU
   device the host's cores shared by batches and CPU stages, with the trace's own
   service times with that sharing divided out, :mod:`radserve.turnaround.solo`), and
   beside it the older models (the times as measured on separate hardware; shared
   cores with the times as measured; shared cores with the warm-up studies' times).

The server, its workers and this client share the host's cores: on a loaded host the
figures include that load (the summary records the load average before and after).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from radserve.bench.errors import BenchError
from radserve.bench.eta_accuracy import (
    JobTrace,
    Reading,
    classes_seen,
    eta_errors,
    group_of,
    offered_load,
    planner_check,
)
from radserve.bench.eta_planner import DEFAULT, divided_records, solo_from_records
from radserve.bench.load import distinct_copies, template_study
from radserve.domain.priority import PriorityClass
from radserve.host import usable_cores
from radserve.turnaround.eta import on_host_cores

FINAL = ("succeeded", "failed", "cancelled")
MIX = (0.2, 0.3, 0.5)  # URGENT, INPATIENT, OUTPATIENT
MISS_LOAD = 2.0  # the burst brings this many URGENT TATs of work: about half miss
_CLASSES = (PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT)


class _Uvicorn:
    """The app served by uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from radserve.api.http_limits import BoundedHttpToolsProtocol

        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(
            app, http=BoundedHttpToolsProtocol, log_config=None, access_log=False
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def __enter__(self) -> _Uvicorn:
        self._thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise BenchError("the in-process server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self._thread.join(120)
        self._socket.close()


def _ts(value: str | None) -> float | None:
    return dt.datetime.fromisoformat(value).timestamp() if value else None


def _reading(job: dict[str, Any], at: float) -> Reading | None:
    eta = job.get("eta")
    if not eta:
        return None
    return Reading(
        at,
        job["state"],
        _ts(eta["predicted_finish"]) or 0.0,
        eta["order_position"],
        _ts(eta["predicted_finish_late"]),
    )


def _arrivals(
    burst: int, gap_s: float, mix: Sequence[float], seed: int, lead_in: int = 0
) -> Iterator[Any]:
    """(offset s, class) of each submission, without end: ``lead_in`` Poisson arrivals,
    then ``burst`` at once, then Poisson gaps. The lead-in is unmeasured (the server
    has seen the stream before the measured jobs come), the next ``n_studies`` are
    measured, and the rest keep the same stream arriving (unmeasured filler) until
    every measured job has finished."""
    rng = np.random.default_rng(seed)
    weights = np.asarray(mix, dtype=float) / float(sum(mix))
    t, i = 0.0, 0
    while True:
        if i > 0 and not lead_in < i < lead_in + burst:
            t += float(rng.exponential(gap_s))
        yield (t, _CLASSES[int(rng.choice(3, p=weights))])
        i += 1


def run_eta_trace(
    *,
    n_studies: int = 16,
    burst: int = 4,
    load: float = 1.5,
    mix: Sequence[float] = MIX,
    seed: int = 0,
    cpu_workers: int = 2,
    poll_s: float = 0.25,
    templates: Sequence[Sequence[Path]] | None = None,
    overrides: dict[str, Any] | None = None,
    timeout_s: float = 1800.0,
    miss_burst_max: int = 24,
    fillers: bool = True,
    lead_in: int = 8,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the scenario; returns the JSON summary. ``templates`` (DICOM files of one
    study each; default: three small phantoms of different sizes) and ``overrides``
    (settings) let a test run it on its tiny models; ``miss_burst_max`` 0 leaves the
    burst out; ``fillers`` False ends the arrivals with the last measured study, and
    ``lead_in`` unmeasured arrivals of the same stream come before the measured ones."""
    from radserve.api import create_app
    from radserve.config import load_settings
    from radserve.service import Service
    from radserve.service.turnaround import learn_from_store, learn_records
    from radserve.turnaround.service_time import Prior, ServiceTimeModel

    if n_studies < 2 or load <= 0 or len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        raise ValueError("eta scenario: n_studies >= 2, load > 0, three class weights >= 0")
    workdir = Path(tempfile.mkdtemp(prefix="radserve-eta-"))
    load_before = os.getloadavg()
    try:
        if templates is None:
            log("writing three small phantom studies (templates)")
            templates = [template_study(workdir / f"template-{s}", seed=s) for s in (1, 2, 3)]
        max_fillers = n_studies if fillers else 0
        total = n_studies + max(0, miss_burst_max) + max_fillers + max(0, lead_in)
        per_template = -(-total // len(templates)) + 1
        copies = [distinct_copies(list(t), per_template) for t in templates]
        warmup = [c.pop() for c in copies]
        studies = [copies[i % len(copies)].pop() for i in range(total)]
        spare = studies[n_studies + max(0, miss_burst_max) :]
        settings = load_settings(None, data_dir=workdir / "data", **(overrides or {}))
        service = Service(settings, cpu_workers=cpu_workers, worker_nice=5)
        records: list[dict[str, Any]] = []  # every ETA walk's inputs, every job's end
        with _Uvicorn(create_app(service)) as server:
            _, key = service.store.create_api_key(name="bench eta", role="admin")
            client = httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=300
            )
            with client:
                if not service.wait_warm(600):
                    raise BenchError("the server's models did not warm up")
                service_s, warm_ids = _warm_up(client, warmup, timeout_s, log)
                gap = service_s / load
                plan = _arrivals(burst, gap, mix, seed, max(0, lead_in))
                service.turnaround.recorder = records.append
                # the arrivals the rates had counted (the warm-up's): a replay counts on
                arrivals_at_start = service.turnaround.arrivals_seen()
                # the model the recorded walks start from: a replay refits it (replay.Refit)
                model_at_start = service.turnaround.model.to_json()
                at_once = min(burst, n_studies)  # fewer studies than a burst: all at once
                then = (
                    f", then one every {gap:.2f} s on average (load {load:g} x the warm-up "
                    f"service time {service_s:.2f} s)"
                    if n_studies > burst
                    else ""
                )
                log(f"{n_studies} studies: {at_once} at once{then}")
                jobs, filled = _stream(
                    client,
                    studies[:n_studies],
                    plan,
                    poll_s,
                    timeout_s,
                    log,
                    filler=spare.pop,
                    max_fillers=max_fillers,
                    lead_in=max(0, lead_in),
                )
                stream_misses = client.get("/v1/ops/turnaround").json()["misses"]
                urgent_tat = service.scheduler.config.tat(PriorityClass.URGENT)
                n_burst = min(miss_burst_max, math.ceil(MISS_LOAD * urgent_tat / service_s))
                surge: dict[str, JobTrace] = {}
                if n_burst > 0:
                    log(
                        f"burst: {n_burst} URGENT studies at once "
                        f"(~{n_burst * service_s:.0f} s of work, URGENT TAT {urgent_tat:g} s)"
                    )
                    surge, _ = _stream(
                        client,
                        studies[n_studies : n_studies + n_burst],
                        itertools.repeat((0.0, PriorityClass.URGENT)),
                        poll_s,
                        timeout_s,
                        log,
                    )
                service.turnaround.recorder = None
                view = client.get("/v1/ops/turnaround").json()
                misses, eta_bias = view["misses"], view.get("eta_bias")
            done = [j for j in jobs.values() if j.state == "succeeded"]
            if not done:
                raise BenchError("no job of the trace succeeded")
            first = service.store.get_job(done[0].job_id)
            model = ServiceTimeModel(
                Prior(
                    settings.turnaround.prior_fixed_s,
                    settings.turnaround.prior_per_slice_s,
                    settings.turnaround.prior_device_share,
                )
            )
            device = service.catalog.sessions.runtime.device
            learn_from_store(model, service.store, device, 1000)
            # the warm-up studies ran alone: their times are the host's solo service times
            solo = ServiceTimeModel(model.prior)
            warm = (r for i in warm_ids if (r := service.store.get_job(i)) is not None)
            learn_records(solo, warm, device)
            log("planner: simulating the same arrivals with the learned service times")
            group = group_of(model, first.pipeline_name, first.precision)
            shared = usable_cores() if on_host_cores(device) else None
            # radserve plan's default: on a CPU device shared cores, fed the trace's own
            # times with the sharing they ran under divided out (as radserve plan learns
            # them from the store); without host cores, the times as measured
            default = (
                model
                if shared is None
                else solo_from_records(divided_records(records, shared, cpu_workers), model, group)
            )
            # older models beside it: the device as separate hardware (radserve plan's
            # default before session 9), shared cores with the times as measured (the
            # sharing counted twice), and with the warm-up studies' solo times
            planner, separate, shared_cores, host_model = (
                planner_check(
                    list(jobs.values()),
                    times,
                    group,
                    scheduler=service.scheduler.config,
                    cpu_workers=cpu_workers,
                    cores_per_device=cores,
                    fillers=filled,
                )
                for times, cores in (
                    (default, shared),
                    (model, None),
                    (model, shared),
                    (solo, shared),
                )
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    start = min(j.arrival for j in jobs.values())
    return {
        "scenario": "eta",
        "studies": n_studies,
        "burst": burst,
        "lead_in": max(0, lead_in),
        "load": load,
        "offered_load": offered_load(records, sorted(jobs), gap),
        "warmup_service_s": round(service_s, 3),
        "mean_gap_s": round(gap, 3),
        "classes": dict(classes_seen(list(jobs.values()))),
        "seed": seed,
        "cpu_workers": cpu_workers,
        "device": device,
        "pipeline": first.pipeline_name,
        "host": {
            "usable_cores": usable_cores(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "failed_jobs": sum(j.state != "succeeded" for j in jobs.values()),
        "eta_error": eta_errors(list(jobs.values())),
        "eta_error_late": eta_errors(list(jobs.values()), late=True),
        "deadline_misses": misses,
        "deadline_misses_stream": stream_misses,
        "miss_burst": {
            "studies": len(surge),
            "urgent_tat_s": urgent_tat,
            "misses": misses["misses"] - stream_misses["misses"],
            "predicted": misses["predicted"] - stream_misses["predicted"],
            "failed_jobs": sum(j.state != "succeeded" for j in surge.values()),
            "tat_s_max": max((j.tat or 0.0 for j in surge.values()), default=None),
        },
        "eta_bias": eta_bias,
        # radserve plan's default (since 2026-12-02 session 10 here; before, "planner"
        # was the separate-hardware model)
        "planner": planner,
        "planner_model": DEFAULT if shared is not None else "trace times",
        "planner_separate_hardware": separate,
        "planner_shared_cores": shared_cores,
        "planner_host_model": host_model,
        "jobs": [_row(j, start) for j in sorted(jobs.values(), key=lambda j: j.arrival)],
        # unmeasured arrivals of the same stream: the lead-in before the measured ones
        # (offsets < 0) and after the last, until every measured job had finished (then
        # cancelled): [offset s, class, slices]
        "fillers": [[round(t - start, 3), c.value, n] for t, c, n in filled],
        # the server's ETA walks and job ends, for radserve.turnaround.replay
        "eta_records": records,
        "measured_ids": sorted(jobs),
        # what the planner was given, to replay it offline (ServiceTimeModel.from_json)
        "service_times": model.to_json(),
        "service_times_solo": solo.to_json(),
        "service_times_at_start": model_at_start,
        # [class rank, scheduler clock s] (since 2026-12-02 session 11)
        "arrivals_at_start": [list(a) for a in arrivals_at_start],
    }


def _submit(client: httpx.Client, blobs: list[bytes], cls: PriorityClass | None) -> str:
    files = [("files", (f"{i}.dcm", b, "application/dicom")) for i, b in enumerate(blobs)]
    params = {"priority": cls.value} if cls is not None else {}
    response = client.post("/v1/studies", files=files, params=params)
    if response.status_code not in (200, 202):
        raise BenchError(f"submission refused: HTTP {response.status_code} {response.text}")
    return str(response.json()["id"])


def _wait(client: httpx.Client, job_ids: Sequence[str], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {j: client.get(f"/v1/jobs/{j}").json() for j in job_ids}
        if all(v["state"] in FINAL for v in jobs.values()):
            return jobs
        if time.monotonic() > deadline:
            raise BenchError(f"jobs did not finish within {timeout_s:.0f} s")
        time.sleep(0.25)


def _warm_up(
    client: httpx.Client, studies: list[list[bytes]], timeout_s: float, log: Callable[[str], None]
) -> tuple[float, list[str]]:
    """Run each warm-up study alone; their mean service time (started -> finished) and
    their job ids."""
    seconds, ids = [], []
    for n, blobs in enumerate(studies, start=1):
        ids.append(_submit(client, blobs, PriorityClass.OUTPATIENT))
        job = _wait(client, ids[-1:], timeout_s)
        (record,) = job.values()
        if record["state"] != "succeeded":
            raise BenchError(f"the warm-up study failed: {record.get('error')}")
        seconds.append((_ts(record["finished"]) or 0.0) - (_ts(record["started"]) or 0.0))
        log(f"warm-up {n}/{len(studies)}: {seconds[-1]:.2f} s")
    return float(np.mean(seconds)), ids


def _stream(
    client: httpx.Client,
    studies: list[list[bytes]],
    plan: Iterator[Any],
    poll_s: float,
    timeout_s: float,
    log: Callable[[str], None],
    filler: Callable[[], list[bytes]] | None = None,
    max_fillers: int = 0,
    lead_in: int = 0,
) -> tuple[dict[str, JobTrace], list[tuple[float, PriorityClass, int]]]:
    """Submit ``lead_in`` filler studies at ``plan``'s first offsets (unmeasured: the
    server sees the stream before the measured jobs), then ``studies`` (measured), then,
    with ``filler``, keep
    ``plan``'s arrivals coming with filler studies (at most ``max_fillers``) until every
    measured job has finished; unfinished fillers are then cancelled. The measured jobs'
    traces, and the fillers' (submission time, POSIX s; class; slices)."""
    jobs: dict[str, JobTrace] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                page = client.get(
                    "/v1/jobs", params={"state": ["queued", "running"], "limit": 1000}
                ).json()
            except httpx.HTTPError:
                stop.wait(poll_s)
                continue
            now = time.time()
            with lock:
                for item in page["items"]:
                    trace, reading = jobs.get(item["id"]), _reading(item, now)
                    if trace is not None and reading is not None:
                        trace.readings.append(reading)
            stop.wait(poll_s)

    poller = threading.Thread(target=poll, name="radserve-bench-eta-poll", daemon=True)
    poller.start()
    start = time.monotonic()
    fillers: list[tuple[float, PriorityClass, int]] = []
    filler_ids: list[str] = []
    try:
        for _ in range(lead_in if filler is not None else 0):
            offset, cls = next(plan)
            time.sleep(max(0.0, start + offset - time.monotonic()))
            blobs = filler()
            filler_ids.append(_submit(client, blobs, cls))
            fillers.append((time.time(), cls, len(blobs)))
            log(f"lead-in {len(fillers)}/{lead_in} ({cls.value}): unmeasured")
        lead = len(fillers)
        for n, (blobs, (offset, cls)) in enumerate(zip(studies, plan, strict=False), start=1):
            time.sleep(max(0.0, start + offset - time.monotonic()))
            job_id = _submit(client, blobs, cls)
            record = client.get(f"/v1/jobs/{job_id}").json()
            trace = JobTrace(job_id, cls, _ts(record["arrival"]) or time.time())
            trace.slices = len(blobs)  # one single-frame instance per slice
            first = _reading(record, time.time())
            with lock:
                if first is not None:
                    trace.readings.insert(0, first)
                jobs[job_id] = trace
            position = first.position if first is not None else "-"
            log(f"submitted {n}/{len(studies)} ({cls.value}, {position} ahead)")
        deadline = time.monotonic() + timeout_s
        while filler is not None and len(fillers) - lead < max_fillers:
            offset, cls = next(plan)
            while not _all_final(client, jobs) and time.monotonic() < start + offset:
                time.sleep(min(0.5, max(0.0, start + offset - time.monotonic())))
            if _all_final(client, jobs) or time.monotonic() > deadline:
                break
            blobs = filler()
            filler_ids.append(_submit(client, blobs, cls))
            fillers.append((time.time(), cls, len(blobs)))
            log(f"filler {len(fillers) - lead} ({cls.value}): the stream goes on")
        final = _wait(client, list(jobs), timeout_s)
        for job_id in filler_ids:  # the measured jobs are done: the rest is not needed
            client.delete(f"/v1/jobs/{job_id}")
        _wait(client, filler_ids, timeout_s)
    finally:
        stop.set()
        poller.join(30)
    for job_id, record in final.items():
        jobs[job_id].state = record["state"]
        jobs[job_id].finished = _ts(record.get("finished"))
        jobs[job_id].readings.sort(key=lambda r: r.at)
    return jobs, fillers


def _all_final(client: httpx.Client, jobs: dict[str, JobTrace]) -> bool:
    states = ["received", "queued", "running"]
    page = client.get("/v1/jobs", params={"state": states, "limit": 1000}).json()
    return not any(item["id"] in jobs for item in page["items"])


def _row(job: JobTrace, start: float) -> dict[str, Any]:
    first, error = job.reading("submission"), job.error("submission")
    return {
        "id": job.job_id,
        "class": job.cls.value,
        "arrival_s": round(job.arrival - start, 3),
        "state": job.state,
        "tat_s": None if job.tat is None else round(job.tat, 3),
        "ahead_at_submission": None if first is None else first.position,
        "eta_error_at_submission_rel": None if error is None else round(error[1], 4),
        "readings": len(job.readings),
        "slices": job.slices,
    }


__all__ = ["run_eta_trace"]
