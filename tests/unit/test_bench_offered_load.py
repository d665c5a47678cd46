"""The eta bench's offered load (radserve.bench.eta_accuracy.offered_load): the measured
jobs' mean share of the wall time over the mean gap between arrivals, which says whether
a run is a stream the server drains or an overload (session 30), unlike ``--load``."""

from __future__ import annotations

import pytest
from tests.factories.eta_traces import TRACES

from radserve.bench.eta_accuracy import offered_load, read_summary


def _records(shares: dict[str, float]) -> list[dict[str, object]]:
    walk = {"kind": "walk", "at": 0.0, "capacity": {"urgent_exclusive": True}, "entries": []}
    ends = [
        {"kind": "end", "job": job, "at": 10.0 + i, "state": "succeeded", "share": share}
        for i, (job, share) in enumerate(shares.items())
    ]
    return [walk, *ends]


def test_the_offered_load_is_the_measured_jobs_mean_share_over_the_mean_gap() -> None:
    records = _records({"a": 1.5, "b": 2.5, "filler": 30.0})
    assert offered_load(records, ["a", "b"], 4.0) == pytest.approx(0.5)  # (1.5+2.5)/2 / 4
    assert offered_load(records, ["a", "b"], 1.0) == pytest.approx(2.0)  # cannot be drained
    assert offered_load(records, ["unknown"], 4.0) is None
    assert offered_load(records[1:], ["a"], 4.0) is None  # no walk: no policy recorded
    assert offered_load(records, ["a"], 0.0) is None


def test_the_kept_runs_at_the_two_loads_are_an_overload_and_a_drained_stream() -> None:
    for seed in (0, 1, 2):
        s = read_summary(TRACES / f"eta-quiet-xeon-180bc3a-s{seed}.json.gz")
        assert 1.3 < offered_load(s["eta_records"], s["measured_ids"], s["mean_gap_s"]) < 1.5
    for seed in (0, 1, 2, 3):
        s = read_summary(TRACES / f"eta-quiet-xeon-180bc3a-load1-s{seed}.json.gz")
        assert 0.8 < offered_load(s["eta_records"], s["measured_ids"], s["mean_gap_s"]) < 0.9
