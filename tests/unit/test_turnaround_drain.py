"""The measured drain rate: wall seconds per second of model work while saturated."""

from __future__ import annotations

import pytest

from radserve.turnaround.drain import DrainMeter


def test_neutral_until_enough_saturated_completions() -> None:
    meter = DrainMeter(min_jobs=3)
    meter.saturation(0.0, True)
    meter.completed(10.0, 5.0, True)
    meter.completed(20.0, 5.0, True)
    assert meter.factor() == 1.0  # two samples: the model answers
    meter.completed(30.0, 5.0, True)
    assert meter.factor() == pytest.approx(2.0)  # 30 wall s for 15 s of model work
    assert meter.describe() == {"jobs": 3, "factor": 2.0}


def test_only_saturated_time_counts() -> None:
    meter = DrainMeter(min_jobs=1)
    meter.completed(10.0, 5.0, False)  # nobody waiting: latency, not throughput
    assert meter.factor() == 1.0
    meter.saturation(100.0, True)  # a queue forms at 100 s
    meter.completed(104.0, 8.0, True)  # faster than the model
    assert meter.factor() == pytest.approx(0.5)
    meter.saturation(105.0, False)  # the queue emptied: the idle stretch is not counted
    meter.saturation(200.0, True)
    meter.completed(212.0, 4.0, False)
    assert meter.factor() == pytest.approx((4 + 12) / (8 + 4))


def test_window_and_bounds() -> None:
    meter = DrainMeter(window=2, min_jobs=1, bounds=(0.5, 5.0))
    meter.saturation(0.0, True)
    for t in (100.0, 200.0, 300.0):
        meter.completed(t, 1.0, True)  # 100x slower than the model: bounded
    assert meter.factor() == 5.0
    assert meter.describe()["jobs"] == 2
