"""Online ETA bias correction: per class, learned from finished jobs, bounded, neutral
at start; and the server's Turnaround learning it and applying it (fake clock)."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest
from tests.factories.turnaround import missing_study_lookup

from radserve.config import QueueLimits, SchedulerSettings, load_settings
from radserve.domain.priority import PriorityClass
from radserve.scheduling import JobEvent, JobRequest, JobState, Scheduler
from radserve.scheduling.clock import FakeClock
from radserve.service.metrics import Metrics
from radserve.service.turnaround import Turnaround
from radserve.store import init_store
from radserve.turnaround.bias import BiasCorrection, depth_band, horizon_band


def test_a_new_correction_is_neutral_for_every_class() -> None:
    bias = BiasCorrection()
    assert bias.factor(0) == bias.factor(2) == 1.0
    assert bias.correct(2, 100.0, 160.0) == 160.0
    assert bias.describe() == {}


def test_the_factor_moves_toward_the_median_ratio_as_jobs_finish() -> None:
    bias = BiasCorrection(window=20, prior_jobs=3)
    factors = []
    for _ in range(12):
        bias.observe(2, predicted_s=50.0, actual_s=100.0)  # twice as long as predicted
        factors.append(bias.factor(2))
    assert factors == sorted(factors)  # more evidence, more correction
    assert factors[0] == pytest.approx(math.exp(math.log(2) * 1 / 4))  # shrunk: 1 of 1 + 3
    assert factors[-1] == pytest.approx(math.exp(math.log(2) * 12 / 15))
    assert bias.factor(1) == 1.0  # other classes are untouched
    assert bias.correct(2, 100.0, 110.0) == pytest.approx(100.0 + 10.0 * factors[-1])
    assert bias.describe() == {"class 2": {"jobs": 12, "factor": round(factors[-1], 4)}}


def test_one_outlier_does_not_swing_the_median_and_the_factor_is_bounded() -> None:
    bias = BiasCorrection(window=5, prior_jobs=0, bounds=(0.5, 3.0))
    for actual in (40.0, 40.0, 40.0, 40.0, 4000.0):  # one job stuck behind a burst
        bias.observe(1, predicted_s=50.0, actual_s=actual)
    assert bias.factor(1) == pytest.approx(0.8)
    for _ in range(5):
        bias.observe(1, predicted_s=10.0, actual_s=1000.0)
    assert bias.factor(1) == 3.0  # the window has moved on; the bound holds
    for _ in range(5):
        bias.observe(1, predicted_s=100.0, actual_s=1.0)
    assert bias.factor(1) == 0.5


def test_predictions_under_a_second_teach_nothing_and_window_0_disables() -> None:
    bias = BiasCorrection()
    bias.observe(0, predicted_s=0.2, actual_s=5.0)
    assert bias.factor(0) == 1.0
    off = BiasCorrection(window=0)
    off.observe(0, predicted_s=10.0, actual_s=50.0)
    assert off.factor(0) == 1.0


def test_keys_by_depth_and_horizon_bands_and_labels_name_them() -> None:
    assert [depth_band(p) for p in (0, 1, 2, 3, 6, 7, 40)] == [0, 1, 1, 2, 2, 3, 3]
    assert [horizon_band(s) for s in (0.0, 9.9, 10.0, 29.9, 30.0, 89.0, 90.0)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
    ]
    assert BiasCorrection(by="class").key(2, 5, 40.0) == 2
    assert BiasCorrection(by="depth").key(2, 5, 40.0) == 2
    assert BiasCorrection(by="class-depth").key(1, 7, 40.0) == 13
    assert BiasCorrection(by="horizon").key(2, 0, 40.0) == 2
    assert BiasCorrection(by="all").key(2, 5, 40.0) == 0
    assert BiasCorrection(by="class-depth").label(13) == "class 1, depth 7+"
    with pytest.raises(ValueError, match="unknown bias by 'size'"):
        BiasCorrection(by="size")


def test_a_job_teaches_its_first_reading_or_its_first_under_each_key() -> None:
    """``first``: the submission's reading only; ``every``: the first reading in each
    band it passed through (queued deep, then shallow), learned when it finishes."""
    first, every = BiasCorrection(by="depth"), BiasCorrection(by="depth", learn="every")
    for bias in (first, every):
        bias.reading("a", depth_band(5), 0.0, 50.0)  # deep: predicted 50 s, takes 100 s
        bias.reading("a", depth_band(5), 10.0, 55.0)  # same band again: not kept
        bias.reading("a", depth_band(0), 60.0, 80.0)  # first in line: 20 s left, took 40
        assert bias.describe() == {}  # nothing learned before the job finishes
        bias.finished("a", 100.0, succeeded=True)
    assert first.describe() == {"depth 3-6": {"jobs": 1, "factor": round(2**0.25, 4)}}
    assert every.describe() == {
        "depth 0": {"jobs": 1, "factor": round(2**0.25, 4)},
        "depth 3-6": {"jobs": 1, "factor": round(2**0.25, 4)},
    }
    failed = BiasCorrection()
    failed.reading("b", 2, 0.0, 10.0)
    failed.finished("b", 50.0, succeeded=False)  # a failure says nothing of service times
    assert failed.describe() == {}


def test_the_factor_waits_for_min_jobs_and_the_mean_statistic_follows_every_job() -> None:
    bias = BiasCorrection(prior_jobs=0, min_jobs=3, statistic="mean")
    for actual in (20.0, 20.0):
        bias.observe(2, predicted_s=10.0, actual_s=actual)
    assert bias.factor(2) == 1.0  # two of three
    bias.observe(2, predicted_s=10.0, actual_s=40.0)
    assert bias.factor(2) == pytest.approx(math.exp((2 * math.log(2) + math.log(4)) / 3))


def test_a_steady_bias_of_a_synthetic_stream_is_removed() -> None:
    """A stream whose ETAs come 41 % early (as on the Zen 4 trace 2fee6cf-s1: the actual
    time to finish 1 / 0.59 of the predicted), lognormal noise: once jobs have finished,
    the corrected ETAs' median signed error is a third of it or less (the rest is the
    shrinkage's); uncorrected it stays at -41 %. Learned only from jobs finished before
    each reading (no look-ahead)."""
    rng = random.Random(0)
    bias = BiasCorrection(by="class", window=20, prior_jobs=3.0)
    running: list[tuple[float, str]] = []  # (end, job)
    raw_errors, corrected_errors = [], []
    for i in range(120):
        now = 5.0 * i
        while running and running[0][0] <= now:
            end, job = running.pop(0)
            bias.finished(job, end, succeeded=True)
        predicted = rng.uniform(20.0, 60.0)
        actual = predicted / 0.59 * math.exp(rng.gauss(0.0, 0.2))
        job = f"j{i}"
        bias.reading(job, bias.key(2, 4, predicted), now, now + predicted)
        corrected = bias.correct(2, now, now + predicted) - now
        running = sorted([*running, (now + actual, job)])
        if i >= 40:
            raw_errors.append((predicted - actual) / actual)
            corrected_errors.append((corrected - actual) / actual)
    assert statistics.median(raw_errors) == pytest.approx(-0.41, abs=0.04)
    # what is left is the shrinkage's n / (n + 3) of the log-ratio (-7 %) and noise
    assert abs(statistics.median(corrected_errors)) < abs(statistics.median(raw_errors)) / 3


class _NeverRuns:
    models: tuple[str, ...] = ()

    def next_stage(self) -> None:
        return None

    def result(self) -> object:
        return None


def test_the_server_learns_the_bias_of_finished_jobs_and_scales_new_etas(
    tmp_path: Path,
) -> None:
    """Jobs that took twice their first ETA teach OUTPATIENT a factor > 1; the next
    OUTPATIENT ETA's time to finish is scaled by it; INPATIENT's factor stays 1."""
    clock = FakeClock(1000.0)
    config = SchedulerSettings(queue_limits=QueueLimits(inpatient=None, outpatient=None))
    scheduler = Scheduler(config, clock=clock)
    # off by default (README, issue 17): switched on to test what it learns
    settings = load_settings(None, data_dir=tmp_path / "data", turnaround__bias_window_jobs=20)
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    lookup = missing_study_lookup(tmp_path)
    turnaround = Turnaround(
        settings,
        store=store,
        scheduler=scheduler,
        metrics=Metrics(scheduler.snapshot),
        lookup=lookup,
        device="cpu",
        cpu_workers=2,
    )
    try:
        for i in range(6):
            scheduler.submit(JobRequest(f"old-{i}", _NeverRuns(), PriorityClass.OUTPATIENT))
        first = {e.job_id: e.finish for e in turnaround.recompute()}
        clock.advance(5.0)
        for i in range(6):
            job_id = f"old-{i}"
            took = 2 * (first[job_id] - 1000.0)  # twice the predicted time to finish
            turnaround.on_state(
                JobEvent(job_id, JobState.SUCCEEDED, PriorityClass.OUTPATIENT, 1000.0 + took, 0.0)
            )
            scheduler.cancel(job_id)
        view = turnaround.bias_view()
        factor = view["OUTPATIENT"]["factor"]
        assert view["OUTPATIENT"]["jobs"] == 6
        assert factor == pytest.approx(math.exp(math.log(2) * 6 / 9), rel=1e-3)
        assert view["INPATIENT"] == {"jobs": 0, "factor": 1.0}

        scheduler.submit(JobRequest("new-out", _NeverRuns(), PriorityClass.OUTPATIENT))
        corrected = {e.job_id: e for e in turnaround.recompute()}["new-out"]
        raw = turnaround.bias._pending["new-out"][PriorityClass.OUTPATIENT.rank][1]
        at = turnaround.computed_at
        assert at is not None
        assert corrected.finish - at == pytest.approx(factor * (raw - at))
        assert corrected.finish_late >= corrected.finish
    finally:
        store.close()


def test_the_correction_is_off_by_default(tmp_path: Path) -> None:
    """Replayed on recorded traces it did not help (README, issue 17): a finished job
    teaches the server nothing unless turnaround.bias_window_jobs is set."""
    settings = load_settings(None, data_dir=tmp_path / "data")
    assert settings.turnaround.bias_window_jobs == 0
    bias = BiasCorrection(window=settings.turnaround.bias_window_jobs)
    bias.observe(2, predicted_s=50.0, actual_s=100.0)
    assert bias.factor(2) == 1.0 and bias.describe() == {}
