"""The simulation's jobs in the server's own units (radserve.turnaround.units):
per model, batches prepared, run and merged, feed work before stages. Constructed
traces on separate hardware, so every time is exact."""

from __future__ import annotations

import numpy as np
import pytest
from tests.factories.simulation import PLAIN

from radserve.domain.priority import PriorityClass
from radserve.turnaround.simulate import Arrival, JobService, ModelWork, SimConfig, simulate
from radserve.turnaround.units import fine_service

OUT = PriorityClass.OUTPATIENT


def _none(rng: np.random.Generator, cls: PriorityClass) -> JobService:
    raise AssertionError("every arrival brings its work")


def _tats(
    jobs: list[JobService], workers: int, *, feed_first: bool = True, feeder: bool = False
) -> list[float]:
    """Each job's TAT, all arriving at 0 as OUTPATIENT jobs in this order (their rank):
    one simulation per job, counting that job only. Without the device's feeder thread
    by default: the CPU pool's order alone."""
    config = SimConfig(1, workers, PLAIN, urgent_lane=False, feed_first=feed_first, feeder=feeder)
    out = []
    for i in range(len(jobs)):
        trace = [Arrival(0.0, OUT, job, measured=i == j) for j, job in enumerate(jobs)]
        out.append(simulate(trace, _none, config).classes[OUT].tat_p50_s)
    return out


def test_fine_service_follows_the_steps_per_model_and_batch() -> None:
    steps = {
        "queue": 9.0,
        "ingest": 0.3,
        "organs: prepare": 0.2,
        "organs: infer": 1.0,
        "organs: merge": 0.4,
        "organs: postprocess": 0.1,
        "lesions: infer": 0.5,
        "report": 1.2,
        "result lineage": 0.1,
        "run": 5.0,
    }
    job = fine_service(steps, slices=3, batch_slices=2, scale=2.0)
    assert job.cpu_pre_s == pytest.approx(0.6)
    assert job.cpu_post_s == pytest.approx(2.6)  # report and lineage: not queue nor run
    organs, lesions = job.models
    assert organs.batches_s == pytest.approx((1.0, 1.0))
    assert organs.prepare_s == pytest.approx((0.2, 0.2))
    assert organs.merge_s == pytest.approx((0.4, 0.4))
    assert organs.post_s == pytest.approx(0.2)
    assert lesions.batches_s == pytest.approx((0.5, 0.5))
    assert lesions.prepare_s == lesions.merge_s == (0.0, 0.0)  # units of no work
    assert job.batches_s == pytest.approx((1.0, 1.0, 0.5, 0.5))


def test_a_job_alone_prepares_and_merges_beside_its_batches() -> None:
    """Prepare 0.1, run 1.0 (the second preparation meanwhile), run 1.0 (the first
    merge meanwhile), merge 0.1, report 0.5: 2.7 s. The coarse job, its preparations
    and merges after its batches, takes 2.9 s."""
    model = ModelWork((1.0, 1.0), (0.1, 0.1), (0.1, 0.1))
    fine = JobService(0.0, model.batches_s, 0.5, (model,))
    coarse = JobService(0.0, model.batches_s, 0.9)
    assert _tats([fine], 2) == pytest.approx([2.7])
    assert _tats([coarse], 2) == pytest.approx([2.9])


def test_feed_work_goes_before_a_better_ranked_jobs_stage() -> None:
    """Two CPU threads, three jobs of one class. A (best ranked) ingests 0.9 s, then
    reports 1.0 s; B's two batches (0.1 s preparations, 0.5 s runs, 0.1 s merges) run
    meanwhile; C's 1.0 s ingest holds the other thread from 0.2 to 1.2 s. When A's
    ingest ends (0.9 s) B's first merge is waiting: the thread merges it first (feed
    before stage, as the server's ``next_cpu_dispatch``), A's report runs 1.0-2.0 s, B's
    second merge 1.2-1.3 s, then C's empty report. Stages first would have run A's
    report at 0.9 s and B's merges after 1.2 s (A 1.9 s, B 1.4 s)."""
    model = ModelWork((0.5, 0.5), (0.1, 0.1), (0.1, 0.1))
    a = JobService(0.9, (), 1.0)
    b = JobService(0.0, model.batches_s, 0.0, (model,))
    c = JobService(1.0, (), 0.0)
    assert _tats([a, b, c], 2) == pytest.approx([2.0, 1.3, 1.3])
    assert _tats([a, b, c], 2, feed_first=False) == pytest.approx([1.9, 1.4, 1.4])


def test_the_devices_feeder_thread_feeds_its_batches_while_the_pool_is_busy() -> None:
    """One CPU thread. B (best ranked) has an empty ingest and two batches (0.1 s
    preparations, 0.5 s runs, 0.1 s merges); A arrives at 0.05 s and ingests 3.0 s on the
    pool's thread from 0.2 s (after B's two preparations, feed first). The server's
    executor runs a feeder thread beside the device (``radserve-feed-<device>``, feed
    work only): it merges B's batches at 0.6 and 1.1 s while A's ingest holds the pool,
    and B's empty post-processing and report (stages: the pool's) end it at 3.2 s.
    Without it (the simulation before 2026-12-03) B's merges waited for the pool until
    3.2 s: done at 3.4 s."""
    model = ModelWork((0.5, 0.5), (0.1, 0.1), (0.1, 0.1))
    b = JobService(0.0, model.batches_s, 0.0, (model,))
    a = JobService(3.0, (), 0.0)
    tats = {}
    for feeder in (True, False):
        config = SimConfig(1, 1, PLAIN, urgent_lane=False, feeder=feeder)
        trace = [Arrival(0.0, OUT, b), Arrival(0.05, OUT, a, measured=False)]
        tats[feeder] = simulate(trace, _none, config).classes[OUT].tat_p50_s
    assert tats[True] == pytest.approx(3.2)
    assert tats[False] == pytest.approx(3.4)
