"""The service-time model: robust lines per (pipeline, step, device, precision)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from radserve.turnaround.service_time import (
    Prior,
    ServiceTimeModel,
    StudySize,
    recency_weights,
    weighted_median,
)


def _job(model: ServiceTimeModel, slices: int, ingest: float, infer: float, **kw: str) -> None:
    model.observe(
        pipeline=kw.get("pipeline", "ct"),
        device=kw.get("device", "cpu"),
        precision=kw.get("precision", "fp32"),
        size=StudySize(slices, slices * 512 * 512),
        timings={
            "queue": 99.0,
            "ingest": ingest,
            "organs: infer": infer,
            "run": ingest + infer,
            "total": 999.0,
        },
    )


def test_empty_model_answers_with_the_prior() -> None:
    prior = Prior(fixed_s=1.0, per_slice_s=0.01, device_share=0.4)
    est = ServiceTimeModel(prior).estimate(
        pipeline="ct", device="cpu", precision="fp32", size=StudySize(200)
    )
    assert est.source == "prior"
    assert est.latency_s == 3.0
    assert est.device_s == 3.0 * 0.4
    assert est.cpu_s + est.device_s == est.latency_s


def test_fit_recovers_a_line_despite_outliers() -> None:
    rng = np.random.default_rng(7)
    model = ServiceTimeModel()
    for slices in rng.integers(50, 500, size=60):
        ingest = 0.3 + 0.002 * slices + rng.normal(0, 0.01)
        infer = 0.01 * slices + rng.normal(0, 0.02)
        _job(model, int(slices), ingest, infer)
    for _ in range(8):  # jobs slowed 5x by a noisy neighbour
        _job(model, 100, 5 * (0.3 + 0.2), 5 * 1.0)
    lines = {row["step"]: row for row in model.describe()}
    assert set(lines) == {"ingest", "organs: infer", "run"}  # queue/total are not steps
    assert abs(lines["organs: infer"]["seconds_per_slice"] - 0.01) < 0.001
    assert abs(lines["ingest"]["intercept_s"] - 0.3) < 0.05
    assert lines["organs: infer"]["on_device"] is True
    est = model.estimate(pipeline="ct", device="cpu", precision="fp32", size=StudySize(400))
    assert est.source == "fitted"
    assert abs(est.device_s - 4.0) < 0.4
    assert abs(est.cpu_s - (0.3 + 0.8)) < 0.15


def test_keys_are_separate_per_device_and_precision() -> None:
    model = ServiceTimeModel()
    for slices in (100, 200, 300):
        _job(model, slices, 0.1, 0.01 * slices, precision="fp32")
        _job(model, slices, 0.1, 0.005 * slices, precision="int8")
    fp32 = model.estimate(pipeline="ct", device="cpu", precision="fp32", size=StudySize(300))
    int8 = model.estimate(pipeline="ct", device="cpu", precision="int8", size=StudySize(300))
    gpu = model.estimate(pipeline="ct", device="cuda:0", precision="fp32", size=StudySize(300))
    assert fp32.device_s > 1.8 * int8.device_s
    assert gpu.source == "prior"


def test_one_size_only_scales_the_prior_shape() -> None:
    prior = Prior(fixed_s=0.0, per_slice_s=0.02, device_share=0.5)
    model = ServiceTimeModel(prior)
    for _ in range(5):  # always 100 slices, twice as slow as the prior says
        _job(model, 100, 1.0, 1.0)
    est = model.estimate(pipeline="ct", device="cpu", precision="fp32", size=StudySize(300))
    assert est.source == "scaled-prior"
    assert abs(est.latency_s - 6.0) < 1e-6  # 2x the prior's 3 s at 300 slices


def test_round_trip_through_json() -> None:
    model = ServiceTimeModel()
    for slices in (80, 160, 320, 640):
        _job(model, slices, 0.2 + 0.001 * slices, 0.004 * slices)
    again = ServiceTimeModel.from_json(model.to_json())
    size = StudySize(250)
    a = model.estimate(pipeline="ct", device="cpu", precision="fp32", size=size)
    b = again.estimate(pipeline="ct", device="cpu", precision="fp32", size=size)
    assert a == b
    assert again.typical_size() == model.typical_size()


def _run(model: ServiceTimeModel, slices: int, run: float, lane: str | None = None) -> None:
    model.observe(
        pipeline="ct",
        device="cpu",
        precision="fp32",
        size=StudySize(slices),
        timings={"ingest": 0.2 * run, "organs: infer": 0.8 * run, "run": run},
        lane=lane,
    )


def _latency(model: ServiceTimeModel, slices: int, lane: str | None = None) -> float:
    return model.estimate(
        pipeline="ct", device="cpu", precision="fp32", size=StudySize(slices), lane=lane
    ).latency_s


def test_weighted_median_is_the_median_when_weights_are_equal_and_leans_to_heavy_ones() -> None:
    values = np.array([5.0, 1.0, 3.0, 2.0])
    assert weighted_median(values, np.ones(4)) == np.median(values) == 2.5
    assert weighted_median(values[:3], np.ones(3)) == 3.0
    assert weighted_median(values, np.array([1.0, 1.0, 1.0, 10.0])) == 2.0
    assert list(recency_weights(3, 1.0)) == [0.25, 0.5, 1.0]  # oldest first


def test_a_half_life_follows_a_host_that_got_faster_where_the_plain_window_lags() -> None:
    plain, recent = ServiceTimeModel(), ServiceTimeModel(half_life_jobs=5)
    for model in (plain, recent):
        for i in range(30):  # 30 jobs at 3x the speed they ran later ...
            _run(model, 100 + 50 * (i % 3), 3.0 * (1.0 + 0.01 * (100 + 50 * (i % 3))))
        for i in range(12):  # ... then 12 at 1x: 2 s at 100 slices, 3 s at 200
            _run(model, 100 + 50 * (i % 3), 1.0 + 0.01 * (100 + 50 * (i % 3)))
    assert _latency(plain, 200) == pytest.approx(9.0)  # still the old majority
    assert _latency(recent, 200) == pytest.approx(3.0)


def test_a_short_window_forgets_all_but_its_last_jobs() -> None:
    model = ServiceTimeModel(window=5)
    for run in (9.0,) * 20 + (2.0,) * 5:
        _run(model, 100, run)
    assert _latency(model, 100) == pytest.approx(2.0)
    assert model.sizes() == [100] * 5


def test_a_lane_has_its_own_latency_and_shares_the_work_lines() -> None:
    model = ServiceTimeModel()
    for slices in (100, 200, 300):
        _run(model, slices, 0.01 * slices, lane="alone")  # 1-3 s alone
        _run(model, slices, 0.04 * slices, lane="shared")  # 4x that beside others
    assert _latency(model, 200, "alone") == pytest.approx(2.0)
    assert _latency(model, 200, "shared") == pytest.approx(8.0)
    assert _latency(model, 200, "never seen") == _latency(model, 200)  # the pooled run line
    alone = model.estimate(
        pipeline="ct", device="cpu", precision="fp32", size=StudySize(200), lane="alone"
    )
    pooled = model.estimate(pipeline="ct", device="cpu", precision="fp32", size=StudySize(200))
    assert (alone.cpu_s, alone.device_s) == (pooled.cpu_s, pooled.device_s)
    assert "run alone" not in model.step_seconds(
        pipeline="ct", device="cpu", precision="fp32", size=StudySize(200)
    )  # a lane is a whole job's time, not a step


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window >= 1"):
        ServiceTimeModel(window=0)


def test_lanes_survive_json_apart_from_the_per_job_samples() -> None:
    model = ServiceTimeModel(window=50, half_life_jobs=20)
    for i, slices in enumerate((100, 200, 300, 150)):
        _run(model, slices, 0.01 * slices, lane="alone" if i % 2 else "shared")
    data = json.loads(json.dumps(model.to_json()))
    # every row of "samples" has one sample per job (radserve plan reads them so)
    assert {len(r["seconds"]) for r in data["samples"]} == {4}
    assert {r["step"] for r in data["lane_samples"]} == {"run alone", "run shared"}
    again = ServiceTimeModel.from_json(data, window=50, half_life_jobs=20)
    for lane in (None, "alone", "shared"):
        assert _latency(again, 250, lane) == _latency(model, 250, lane)
    assert again.sizes() == model.sizes() == [100, 200, 300, 150]


def test_shares_of_wall_time_are_learned_per_lane_and_are_not_steps() -> None:
    """Three jobs of 100 slices shared 2 s each, three alone 6 s each: the lanes answer
    their own, the pooled line the median (4 s); a model never told a share has none."""
    model = ServiceTimeModel()

    def ask(lane: str | None = None) -> float | None:
        size = StudySize(100)
        est = model.estimate(pipeline="ct", device="cpu", precision="fp32", size=size, lane=lane)
        return est.share_s

    timings = {"ingest": 1.0, "organs: infer": 2.0, "run": 3.0}
    for _ in range(3):
        model.observe(
            pipeline="ct", device="cpu", precision="fp32", size=StudySize(100), timings=timings
        )
    assert ask() is None
    for lane, share in (("shared", 2.0), ("alone", 6.0)) * 3:
        model.observe(
            pipeline="ct",
            device="cpu",
            precision="fp32",
            size=StudySize(100),
            timings=timings,
            lane=lane,
            share_s=share,
        )
    assert ask("shared") == pytest.approx(2.0)
    assert ask("alone") == pytest.approx(6.0)
    assert ask() == pytest.approx(4.0)
    steps = model.step_seconds(pipeline="ct", device="cpu", precision="fp32", size=StudySize(100))
    assert set(steps) == {"ingest", "organs: infer"}
    again = ServiceTimeModel.from_json(json.loads(json.dumps(model.to_json())))
    assert again.estimate(
        pipeline="ct", device="cpu", precision="fp32", size=StudySize(100), lane="alone"
    ).share_s == pytest.approx(6.0)
