"""Offline replay of the server's ETA walks on a recorded trace (radserve.turnaround.replay)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from radserve.turnaround.eta import Arrivals, Capacity, Entry, walk
from radserve.turnaround.replay import (
    Refit,
    Speed,
    Variant,
    errors,
    replay,
    walk_inputs,
    walk_record,
)
from radserve.turnaround.service_time import JobEstimate, ServiceTimeModel, StudySize

EST = JobEstimate(cpu_s=6.0, device_s=4.0, latency_s=10.0, spread_s=1.0, source="fitted")


def _entry(job: str, cls: int = 2, deadline: float = 1000.0) -> Entry:
    return Entry(job, cls, False, deadline=deadline, started=None, estimate=EST)


def _end(job: str, at: float, state: str = "succeeded") -> dict[str, object]:
    return {"kind": "end", "at": at, "job": job, "state": state}


def test_a_walk_record_survives_json_and_gives_back_the_same_inputs() -> None:
    capacity = Capacity(
        cpu_workers=2,
        devices=1,
        arrivals=(Arrivals(0, 0.01, EST),),
        tat_s=(300.0, 3600.0, 86400.0),
        host_cores=2,
    )
    entries = [_entry("a", 0), Entry("b", 2, True, 900.0, 95.0, EST)]
    record = json.loads(json.dumps(walk_record(100.0, entries, capacity)))
    assert walk_inputs(record) == (100.0, entries, capacity)


def test_replay_without_correction_gives_the_walks_own_etas_and_the_recorded_ends() -> None:
    capacity = Capacity(max_running=1)
    first = walk([_entry("a"), _entry("b")], 0.0, capacity)
    records = [
        walk_record(0.0, [_entry("a"), _entry("b")], capacity),
        walk_record(5.0, [_entry("b")], capacity),
        _end("a", 4.0),
        _end("b", 30.0),
    ]
    jobs = {j.job_id: j for j in replay(records, Variant(bias="off"))}
    assert jobs["b"].first == first[1].finish == 20.0  # its first walk, at submission
    assert jobs["b"].position == 1 and jobs["b"].end == 30.0
    assert jobs["b"].readings == [(0.0, 20.0), (5.0, 15.0)]
    # halfway (15 s) is nearest the reading at 5 s; error = |15 - 30| / 30
    figures = errors(list(jobs.values()), measured={"b"}, behind=1)
    assert figures["all"]["jobs"] == 1
    assert figures["behind_1"]["submission"] == {"median_rel": 0.3333, "median_signed_rel": -0.3333}
    assert figures["behind_1"]["halfway"]["median_rel"] == 0.5


def test_the_class_correction_learns_from_ends_before_the_walk_and_not_after() -> None:
    capacity = Capacity(max_running=4)
    records = [
        walk_record(0.0, [_entry("a")], capacity),  # predicted 10 s, took 20 s
        _end("a", 20.0),
        walk_record(30.0, [_entry("b")], capacity),  # one job learned: factor 2 ** (1/4)
        walk_record(31.0, [_entry("c", cls=1)], capacity),  # another class: untouched
        _end("b", 45.0),
        _end("c", 41.0),
    ]
    jobs = {j.job_id: j for j in replay(records, Variant(bias="class"))}
    assert jobs["a"].first == 10.0
    assert jobs["b"].first == pytest.approx(30.0 + 10.0 * math.exp(math.log(2) / 4))
    assert jobs["c"].first == 41.0
    off = {j.job_id: j for j in replay(records, Variant(bias="off"))}
    assert off["b"].first == 40.0


def test_the_depth_correction_keeps_apart_jobs_queued_at_different_depths() -> None:
    capacity = Capacity(max_running=4, cpu_workers=100, devices=100)
    deep = [_entry(f"q{i}") for i in range(3)] + [_entry("d")]  # d: 3 ahead
    records = [
        walk_record(0.0, [_entry("a")], capacity),  # alone: depth 0, twice as long
        _end("a", 20.0),
        walk_record(30.0, [_entry("b")], capacity),
        walk_record(30.0, deep, capacity),
    ]
    jobs = {j.job_id: j for j in replay(records, Variant(bias="depth"))}
    assert jobs["b"].first > 40.0  # depth 0 learned from a
    assert jobs["d"].first == walk(deep, 30.0, capacity)[3].finish  # depth 3: nothing yet


def test_replay_without_the_allowance_drops_later_arrivals() -> None:
    busy = Capacity(arrivals=(Arrivals(0, 0.1, EST),))
    records = [walk_record(0.0, [_entry("a")], busy), _end("a", 10.0)]
    (with_allowance,) = replay(records, Variant(bias="off"))
    (without,) = replay(records, Variant(allowance=False, bias="off"))
    assert without.first == 10.0 < with_allowance.first


def _learned(model: ServiceTimeModel, job: str, slices: int, run: float, at: float) -> dict:
    """A succeeded job's end as the server records it, taught to ``model`` as well."""
    timings = {"ingest": 0.25 * run, "organs: infer": 0.5 * run, "report": 0.25 * run, "run": run}
    model.observe(
        pipeline="ct", device="cpu", precision="fp32", size=StudySize(slices), timings=timings
    )
    return {**_end(job, at), "slices": slices, "timings": timings}


def _estimate(model: ServiceTimeModel, slices: int) -> JobEstimate:
    return model.estimate(pipeline="ct", device="cpu", precision="fp32", size=StudySize(slices))


def test_a_refit_with_the_servers_settings_gives_back_the_recorded_estimates() -> None:
    server = ServiceTimeModel()
    records: list[dict] = []
    for i, slices in enumerate((100, 200, 300)):  # the warm-up: the replay's base
        _learned(server, f"w{i}", slices, 0.01 * slices, float(i))
    base = server.to_json()
    capacity = Capacity(max_running=2)
    for i, (slices, run) in enumerate(((100, 3.0), (200, 4.0), (300, 9.0), (100, 2.0))):
        now = 10.0 * (i + 1)
        queued = Entry(f"j{i}", 2, False, 1e4, None, _estimate(server, slices))
        later = Entry(f"k{i}", 2, False, 1e4, None, _estimate(server, 200))  # never ends
        records.append(walk_record(now, [queued, later], capacity, {f"j{i}": slices}))
        records.append(_learned(server, f"j{i}", slices, run, now + 5.0))
    recorded = {j.job_id: j.readings for j in replay(records, Variant(bias="off"))}
    again = {j.job_id: j.readings for j in replay(records, Variant(refit=Refit()), base)}
    assert again == recorded  # k* sized by the estimate it shared with j1 (200 slices)
    # a one-job window forgets the warm-up: j3 (100 slices) is predicted from j2 alone
    # (9 s at 300 slices: the prior's line, 0.5 s + 0.017 s per slice, scaled to it)
    short = {j.job_id: j for j in replay(records, Variant(refit=Refit(window=1)), base)}
    assert short["j3"].first == pytest.approx(40.0 + 9.0 * (0.5 + 1.7) / (0.5 + 5.1))


def test_a_refit_per_lane_predicts_urgent_work_from_urgent_jobs() -> None:
    server = ServiceTimeModel()
    _learned(server, "w", 100, 1.0, 0.0)
    base = server.to_json()
    capacity = Capacity(max_running=4, cpu_workers=100, devices=100)
    records = [
        walk_record(1.0, [_entry("u", cls=0)], capacity, {"u": 100}),
        _learned(server, "u", 100, 2.0, 3.0),
        walk_record(4.0, [_entry("r", cls=2)], capacity, {"r": 100}),
        _learned(server, "r", 100, 20.0, 24.0),
        walk_record(
            30.0, [_entry("u2", cls=0), _entry("r2", cls=2)], capacity, {"u2": 100, "r2": 100}
        ),
    ]
    by_class = Variant(refit=Refit(lanes="class"))
    lanes = {j.job_id: j.first for j in replay(records, by_class, base)}
    assert lanes["u2"] == pytest.approx(32.0)  # URGENT's own run: 2 s
    assert lanes["r2"] == pytest.approx(52.0)  # after it (urgent_exclusive), then 20 s
    pooled = {j.job_id: j.first for j in replay(records, Variant(refit=Refit()), base)}
    # one run line for all: the median of the runs so far (1; 1, 2; 1, 2, 20 s)
    assert pooled == {"u": 2.0, "r": 5.5, "u2": 32.0, "r2": 34.0}


def test_shares_are_measured_again_from_the_recorded_starts_and_ends() -> None:
    """a runs 0-6 and b 2-10 (their starts read from the walks that saw them running):
    a 2 + 4 / 2 = 4 s, b 4 / 2 + 4 = 6 s; a share the server recorded is taken as it is."""
    from radserve.turnaround.replay import shares_of

    capacity = Capacity(max_running=4)
    a, b = (Entry(j, 2, True, 1e4, s, EST) for j, s in (("a", 0.0), ("b", 2.0)))
    records = [
        walk_record(1.0, [a], capacity),
        walk_record(3.0, [a, b], capacity),
        _end("a", 6.0),
        _end("b", 10.0),
    ]
    assert shares_of(records, urgent_holds=True) == pytest.approx({"a": 4.0, "b": 6.0})
    records[-1] = {**_end("b", 10.0), "share": 7.0}
    assert shares_of(records, urgent_holds=True)["b"] == 7.0


def test_a_walk_record_keeps_the_estimates_shares() -> None:
    shared = JobEstimate(6.0, 4.0, 10.0, 1.0, "fitted", share_s=2.5)
    capacity = Capacity(arrivals=(Arrivals(0, 0.01, shared),))
    entries = [Entry("a", 2, False, 900.0, None, shared), _entry("b")]
    record = json.loads(json.dumps(walk_record(100.0, entries, capacity, {"b": 40})))
    assert walk_inputs(record) == (100.0, entries, capacity)


def test_a_walk_recorded_before_session_11_replays_the_walk_that_server_had() -> None:
    record = walk_record(0.0, [_entry("a")], Capacity())
    for name in ("share_left", "running_behind"):
        del record["capacity"][name]
    _, _, capacity = walk_inputs(record)
    assert (capacity.share_left, capacity.running_behind) == ("latency", False)
    assert walk_inputs(walk_record(0.0, [_entry("a")], Capacity()))[2] == Capacity()


def test_a_running_jobs_share_so_far_is_measured_again_when_not_recorded() -> None:
    """a runs from 0, b from 2 (seen running in the walks at 1 and 3): at 5 s a has had
    2 + 3 / 2 = 3.5 s and b 1.5 s; a share the server recorded is kept."""
    from radserve.turnaround.replay import SharesSoFar

    capacity = Capacity(max_running=4)
    a, b = (Entry(j, 2, True, 1e4, s, EST) for j, s in (("a", 0.0), ("b", 2.0)))
    records = [walk_record(1.0, [a], capacity), walk_record(3.0, [a, b], capacity)]
    filled = SharesSoFar(records, urgent_holds=True).fill([a, b], 5.0)
    assert [e.share_so_far for e in filled] == pytest.approx([3.5, 1.5])
    kept = Entry("a", 2, True, 1e4, 0.0, EST, 9.0)
    assert SharesSoFar(records, urgent_holds=True).fill([kept], 5.0)[0].share_so_far == 9.0


def test_the_arrival_rates_are_counted_again_from_each_jobs_first_walk() -> None:
    """Five URGENT jobs first walked at 0, 2 .. 8 s (the recording's capacity had no
    rates): counted again since the first arrival, 0.5 a second at 10 s, and the routine
    job queued then is allowed for them as a capacity with that rate would be."""
    from radserve.turnaround.rates import ArrivalRates

    capacity = Capacity(max_running=4)
    records = [walk_record(2.0 * i, [_entry(f"u{i}", cls=0)], capacity) for i in range(5)]
    records.append(walk_record(10.0, [_entry("r")], capacity))
    rates = ArrivalRates(min_span_s=1.0, prior_arrivals=0.0)
    (routine,) = (j for j in replay(records, Variant(rates=rates)) if j.job_id == "r")
    expected = walk([_entry("r")], 10.0, Capacity(max_running=4, arrivals=(Arrivals(0, 0.5, EST),)))
    assert routine.first == pytest.approx(expected[0].finish)
    (as_recorded,) = (j for j in replay(records) if j.job_id == "r")
    assert as_recorded.first == 20.0 < routine.first


def test_shares_per_class_give_each_queued_job_its_own_classs_share_once_learned() -> None:
    """Two INPATIENT jobs spent 1 s of wall time each, two OUTPATIENT jobs 3 s (an
    OUTPATIENT job beside INPATIENT work waits at the device through its equal split):
    pooled, every routine job ahead counts the median, 2 s; per class (2 jobs each), the
    INPATIENT job queued first counts 1 s and the OUTPATIENT job after it 3 s more. With
    fewer jobs of its class than asked for, a job keeps the pooled share."""
    server = ServiceTimeModel()
    _learned(server, "w", 100, 0.5, 0.0)
    base = server.to_json()
    capacity = Capacity(max_running=8)
    done = [("i1", 1, 1.0), ("i2", 1, 1.0), ("o1", 2, 3.0), ("o2", 2, 3.0)]
    records = [walk_record(1.0, [_entry(j, cls) for j, cls, _ in done], capacity)]
    for n, (job, _, share) in enumerate(done):
        records.append({**_learned(server, job, 100, 0.5, 10.0 + n), "share": share})
    sizes = {"i9": 100, "o9": 100}
    records.append(walk_record(100.0, [_entry("i9", 1), _entry("o9", 2)], capacity, sizes))

    def firsts(class_shares: int) -> dict[str, float]:
        refit = Refit(lanes="exclusive", shares=True, class_shares=class_shares)
        jobs = replay(records, Variant(refit=refit), base)
        return {j.job_id: j.first for j in jobs if j.job_id.endswith("9")}

    assert firsts(0) == pytest.approx({"i9": 102.0, "o9": 104.0})
    assert firsts(2) == pytest.approx({"i9": 101.0, "o9": 104.0})
    assert firsts(3) == firsts(0)


def test_the_present_work_correction_scales_shares_by_what_finished_jobs_really_took() -> None:
    """Session 16's replay variant: a finished job that took twice its estimated share
    of the wall time scales the shares of the running jobs (``running``) or of every job
    (``all``) by its learned factor (one job, shrunk: 2 ** (1 / 4))."""
    shared = JobEstimate(6.0, 4.0, 2.0, 0.0, "fitted", share_s=5.0)
    capacity = Capacity(max_running=4)
    running = Entry("b", 2, True, 1000.0, 30.0, shared, share_so_far=0.0)
    queued = Entry("c", 2, False, 1000.0, None, shared)
    records = [
        walk_record(0.0, [Entry("a", 2, False, 1000.0, None, shared)], capacity),
        {**_end("a", 10.0), "share": 10.0},
        walk_record(30.0, [running, queued], capacity),
    ]
    factor = 2 ** (1 / 4)
    off = {j.job_id: j.first for j in replay(records, Variant())}
    assert (off["b"], off["c"]) == (35.0, 40.0)  # each share after the one ahead
    on_running = {j.job_id: j.first for j in replay(records, Variant(present="running"))}
    assert on_running["b"] == pytest.approx(30.0 + 5.0 * factor)
    assert on_running["c"] == pytest.approx(on_running["b"] + 5.0)
    on_all = {j.job_id: j.first for j in replay(records, Variant(present="all"))}
    assert on_all["c"] == pytest.approx(30.0 + 10.0 * factor)


def test_the_host_speed_factor_scales_the_work_by_the_finished_jobs_service_times() -> None:
    """Session 18's replay variant: a finished job whose run took twice the latency
    estimated when it started makes the host look slower: every later estimate (the
    queued jobs', here) is scaled by the shrunk factor, 2 ** (1 / 4) after one job."""
    shared = JobEstimate(6.0, 4.0, 10.0, 0.0, "fitted", share_s=5.0)
    capacity = Capacity(max_running=4)
    records = [
        walk_record(0.0, [Entry("a", 2, True, 1000.0, 0.0, shared, share_so_far=0.0)], capacity),
        {**_end("a", 20.0), "timings": {"run": 20.0, "ingest": 1.0, "report": 1.0}},
        walk_record(30.0, [Entry("c", 2, False, 1000.0, None, shared)], capacity),
    ]
    off = {j.job_id: j.first for j in replay(records, Variant())}
    assert off["c"] == 40.0  # its latency
    by_run = {j.job_id: j.first for j in replay(records, Variant(speed=Speed(measure="run")))}
    assert by_run["c"] == pytest.approx(30.0 + 10.0 * 2 ** (1 / 4))
    # learned from URGENT jobs alone: the routine job teaches nothing
    alone = replay(records, Variant(speed=Speed(measure="run", per="alone")))
    assert {j.job_id: j.first for j in alone}["c"] == 40.0
    # its stages (2 s) against its estimated CPU and device work (10 s): a faster host
    by_stages = replay(records, Variant(speed=Speed(measure="stages")))
    assert {j.job_id: j.first for j in by_stages}["c"] < 40.0


def test_the_conformal_band_is_the_finished_jobs_ratio_quantile() -> None:
    """Session 18's replay variant: once three jobs have finished, the band's late end is
    the quantile of their actual / predicted times to finish; its coverage and width are
    scored."""
    capacity = Capacity(max_running=4)
    exact = JobEstimate(6.0, 4.0, 10.0, 0.0, "fitted")  # no noise: the walk's band is empty

    def job(name: str) -> Entry:
        return Entry(name, 2, False, 1000.0, None, exact)

    records: list[dict[str, object]] = []
    for i, took in enumerate((10.0, 20.0, 15.0)):  # predicted 10 s each: ratios 1, 2, 1.5
        at = 100.0 * i
        records += [walk_record(at, [job(f"j{i}")], capacity), _end(f"j{i}", at + took)]
    records += [walk_record(300.0, [job("k")], capacity), _end("k", 318.0)]
    variant = Variant(band_quantile=0.9, band_window=10)
    jobs = {j.job_id: j for j in replay(records, variant)}
    assert jobs["j2"].first_late == jobs["j2"].first  # two ratios: the walk's own band
    assert jobs["k"].first_late == 300.0 + 2.0 * 10.0  # the top of three ratios
    figures = errors(list(jobs.values()))["all"]
    assert figures["late_coverage"] == 0.5  # j1 and j2 finished past their empty bands
    assert figures["late_width_rel"] == pytest.approx(statistics.median([0, 0, 0, 10 / 18]))
