"""The service-time model: robust lines per (pipeline, step, device, precision)."""

from __future__ import annotations

import numpy as np

from radserve.turnaround.service_time import Prior, ServiceTimeModel, StudySize


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
