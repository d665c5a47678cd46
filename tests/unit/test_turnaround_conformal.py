"""The conformal band (turnaround.band: conformal): what it learns, what it keeps, and
the late end the walk draws from it."""

from __future__ import annotations

import pytest

from radserve.turnaround.conformal import MIN_JOBS, ConformalBand
from radserve.turnaround.eta import Capacity, Entry, walk
from radserve.turnaround.service_time import JobEstimate

EST = JobEstimate(cpu_s=6.0, device_s=4.0, latency_s=10.0, spread_s=2.0, source="fitted")


def _learn(band: ConformalBand, ratios: list[float]) -> None:
    for i, ratio in enumerate(ratios):
        band.reading(f"job-{i}", 100.0, 110.0)  # predicted 10 s to finish
        band.finished(f"job-{i}", 100.0 + 10.0 * ratio, succeeded=True)


def test_the_walks_band_answers_until_enough_jobs_have_finished() -> None:
    band = ConformalBand(0.9, 20)
    _learn(band, [2.0] * (MIN_JOBS - 1))
    assert band.ratio() is None
    assert band.late("queued", 0.0, 50.0, late=70.0) == 70.0  # the walk's own


def test_the_late_end_is_the_quantile_of_the_finished_jobs_ratios() -> None:
    band = ConformalBand(0.9, 20)
    ratios = [1.0 + i / 10 for i in range(20)]  # 1.0 ... 2.9
    _learn(band, ratios)
    # the 19th smallest of 20 (index int(0.9 x 20)): two of the twenty above it
    assert band.ratio() == pytest.approx(2.8)
    assert band.late("queued", 0.0, 50.0, late=70.0) == pytest.approx(2.8 * 50.0)
    assert band.describe() == {"jobs": 20, "ratio": 2.8}


def test_memory_is_bounded_and_failed_or_short_jobs_teach_nothing() -> None:
    band = ConformalBand(0.9, 5)
    _learn(band, [1.5] * 12)
    assert len(band.ratios) == 5 and not band.first
    band.reading("failed", 0.0, 20.0)
    band.finished("failed", 100.0, succeeded=False)
    band.reading("short", 0.0, 0.5)  # under a second predicted: no ratio
    band.finished("short", 10.0, succeeded=True)
    assert band.describe() == {"jobs": 5, "ratio": 1.5} and not band.first


def test_a_ratio_under_one_never_puts_the_late_end_before_the_finish() -> None:
    band = ConformalBand(0.9, 20)
    _learn(band, [0.5] * 10)
    assert band.late("queued", 0.0, 50.0, late=70.0) == 50.0


def test_the_walk_scales_every_time_to_finish_by_the_learned_ratio() -> None:
    entries = [Entry(f"j{i}", 2, False, 1e9, None, EST) for i in range(6)]
    own = walk(entries, 0.0, Capacity())
    learned = walk(entries, 0.0, Capacity(late_ratio=1.7))
    for a, b in zip(own, learned, strict=True):
        assert (b.start, b.finish) == (a.start, a.finish)
        assert b.finish_late == pytest.approx(1.7 * a.finish)
    assert walk(entries, 0.0, Capacity(late_ratio=0.4))[0].finish_late == own[0].finish
