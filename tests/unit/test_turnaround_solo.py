"""Solo service times divided out of jobs that shared the host's cores (known answers)."""

from __future__ import annotations

import pytest
from tests.factories.simulation import PLAIN

from radserve.domain.priority import PriorityClass
from radserve.turnaround.service_time import RUN, StudySize
from radserve.turnaround.simulate import SimConfig
from radserve.turnaround.solo import (
    JobRun,
    consistent_timings,
    runs_from_end_records,
    slowdowns,
    solo_model,
    solo_timings,
)

U, OUT = PriorityClass.URGENT, PriorityClass.OUTPATIENT


def _run(cls: PriorityClass, start: float, end: float, **timings: float) -> JobRun:
    named = {k.replace("_", ": ") if k.endswith("_infer") else k: v for k, v in timings.items()}
    return JobRun(cls, start, start, end, 40, {**named, RUN: end - start})


def test_a_job_alone_keeps_its_times() -> None:
    run = _run(OUT, 0.0, 5.0, ingest=1.0, organs_infer=3.0, report=1.0)
    [slow] = slowdowns([run], cores=2)
    assert (slow.cpu, slow.device, slow.paused_cpu_s) == (1.0, 1.0, 0.0)
    solo = solo_timings(run, slow)
    assert solo == {"ingest": 1.0, "organs: infer": 3.0, "report": 1.0, RUN: 5.0}


def test_two_equal_jobs_on_one_core_ran_at_half_speed() -> None:
    runs = [_run(OUT, 0.0, 6.0, ingest=6.0), _run(OUT, 0.0, 6.0, ingest=6.0)]
    for run, slow in zip(runs, slowdowns(runs, cores=1), strict=True):
        assert slow.cpu == pytest.approx(2.0)
        assert solo_timings(run, slow)["ingest"] == pytest.approx(3.0)


def test_a_batch_and_a_cpu_stage_sharing_two_cores_are_undone() -> None:
    """The simulation's own case (test_turnaround_simulate): a 2 s batch on both cores
    and a 2 s CPU stage start together and both end at 3 s; measured 3 s each, the
    normalisation gives back 2 s each."""
    batch = _run(OUT, 0.0, 3.0, organs_infer=3.0)
    stage = _run(OUT, 0.0, 3.0, ingest=3.0)
    slow = slowdowns([batch, stage], cores=2)
    assert solo_timings(batch, slow[0])["organs: infer"] == pytest.approx(2.0)
    assert solo_timings(stage, slow[1])["ingest"] == pytest.approx(2.0)


def test_a_routine_job_held_for_urgent_work_loses_the_held_time_not_speed() -> None:
    """A routine CPU-only job runs 0-10 s, held 2-4 s while an URGENT job ran: its
    10 s of stage time hold 2 s of pause; it ran alone otherwise (solo 8 s), and the
    URGENT job ran alone (the routine one was held)."""
    routine = _run(OUT, 0.0, 10.0, ingest=10.0)
    urgent = _run(U, 2.0, 4.0, ingest=2.0)
    slow = slowdowns([routine, urgent], cores=2)
    assert slow[0].paused_cpu_s == pytest.approx(2.0)
    assert solo_timings(routine, slow[0])["ingest"] == pytest.approx(8.0)
    assert solo_timings(urgent, slow[1])["ingest"] == pytest.approx(2.0)
    # without the URGENT hold (urgent_exclusive and yield_to_urgent off) they shared
    free = slowdowns([routine, urgent], cores=1, urgent_holds=False)
    assert free[0].paused_cpu_s == 0.0 and free[1].cpu == pytest.approx(2.0)


def test_a_measured_pause_is_taken_as_the_scheduler_recorded_it() -> None:
    """Since session 24 a job's timings say how long its CPU stages paused (``paused``,
    inside them): that, not the estimate from the URGENT job's span, is taken off; it is
    not a stage of its own."""
    routine = _run(OUT, 0.0, 10.0, ingest=10.0, paused=3.0)
    urgent = _run(U, 2.0, 4.0, ingest=2.0)
    assert routine.cpu_s == pytest.approx(10.0)
    slow = slowdowns([routine, urgent], cores=2)
    assert slow[0].paused_cpu_s == pytest.approx(3.0)  # the estimate would be 2.0
    solo = solo_timings(routine, slow[0])
    assert solo["ingest"] == pytest.approx(7.0) and "paused" not in solo
    # more than the CPU stages hold is not believed
    [odd, _] = slowdowns([_run(OUT, 0.0, 10.0, ingest=10.0, paused=12.0), urgent], cores=2)
    assert odd.paused_cpu_s == pytest.approx(10.0)


def test_the_solo_model_learns_the_divided_times() -> None:
    runs = [_run(OUT, 0.0, 6.0, ingest=6.0), _run(OUT, 0.0, 6.0, ingest=6.0)]
    model = solo_model(runs, 1, pipeline="p", device="cpu", precision="fp32")
    steps = model.step_seconds(pipeline="p", device="cpu", precision="fp32", size=StudySize(40))
    assert steps["ingest"] == pytest.approx(3.0)


def test_runs_are_read_from_a_bench_s_end_records() -> None:
    records = [
        {"kind": "walk", "at": 1.0, "entries": [["a", 0, False, 9.0, None]]},
        {
            "kind": "end",
            "at": 10.0,
            "job": "a",
            "state": "succeeded",
            "slices": 40,
            "timings": {"queue": 1.0, "ingest": 2.0, RUN: 4.0, "total": 5.0},
        },
        {"kind": "end", "at": 11.0, "job": "b", "state": "cancelled"},
    ]
    [run] = runs_from_end_records(records)
    assert (run.cls, run.arrival, run.started, run.finished, run.slices) == (U, 5.0, 6.0, 10.0, 40)
    assert run.cpu_s == 2.0 and run.device_s == 0.0


def test_no_more_threads_share_the_cores_than_the_server_runs() -> None:
    """Ten URGENT jobs started together, one CPU thread each all along, on one core: the
    mean field says each shared with nine others, but the server runs at most 3 threads
    (2 CPU workers and the URGENT lane), so each ran at a third of its speed at worst."""
    runs = [_run(U, 0.0, 10.0, ingest=10.0) for _ in range(10)]
    assert slowdowns(runs, cores=1)[0].cpu == pytest.approx(10.0)
    assert slowdowns(runs, cores=1, max_threads=3)[0].cpu == pytest.approx(3.0)


def test_times_alone_draw_their_noise_from_their_own_jobs() -> None:
    """Ten jobs of one size alone, 2 s of work but one at 6 s: the line is the median
    (2 s), and the planner's draws are the jobs' own ratios to it (1 or 3), so the
    simulated mean work is the measured mean (2.4 s), not the median's."""
    import numpy as np

    from radserve.turnaround.plan import ModelSampler

    runs = [_run(OUT, 10.0 * i, 10.0 * i + 2.0, ingest=2.0) for i in range(9)]
    runs.append(_run(OUT, 100.0, 106.0, ingest=6.0))
    model = solo_model(runs, 2, pipeline="p", device="cpu", precision="fp32")
    sampler = ModelSampler(model, "p", "cpu", "fp32")
    assert sorted(set(np.round(sampler.ratios, 6))) == [1.0, 3.0]
    rng = np.random.default_rng(0)
    works = [sampler.service(rng, 40).cpu_pre_s for _ in range(2000)]
    assert set(np.round(works, 6)) == {2.0, 6.0}
    assert np.mean(works) == pytest.approx(2.4, rel=0.1)


def test_each_class_draws_its_noise_from_its_own_jobs() -> None:
    """Eleven OUTPATIENT jobs alone with 3 s of work and ten URGENT ones with 1 s, one
    after another (nothing shared): the pooled line is the median, 3 s; URGENT jobs draw
    their own ratio 1/3 (1 s of work), OUTPATIENT 1 (3 s), and INPATIENT, with no jobs
    of its own, the pooled ratios (1 or 1/3)."""
    import numpy as np

    from radserve.turnaround.plan import ModelSampler

    runs = [_run(OUT, 10.0 * i, 10.0 * i + 3.0, ingest=3.0) for i in range(11)]
    runs += [_run(U, 200.0 + 10.0 * i, 201.0 + 10.0 * i, ingest=1.0) for i in range(10)]
    model = solo_model(runs, 2, pipeline="p", device="cpu", precision="fp32")
    assert ModelSampler(model, "p", "cpu", "fp32").class_ratios == {}  # not the default
    sampler = ModelSampler(model, "p", "cpu", "fp32", per_class=True)
    assert sum(sampler._steps(40).values()) == pytest.approx(3.0)
    assert {c: sorted(set(np.round(r, 6))) for c, r in sampler.class_ratios.items()} == {
        OUT: [1.0],
        U: [0.333333],
    }
    rng = np.random.default_rng(0)
    assert {round(sampler.service(rng, 40, U).cpu_pre_s, 6) for _ in range(50)} == {1.0}
    assert {round(sampler(rng, OUT).cpu_pre_s, 6) for _ in range(50)} == {3.0}
    pooled = {
        round(sampler.service(rng, 40, PriorityClass.INPATIENT).cpu_pre_s, 6) for _ in range(200)
    }
    assert pooled == {1.0, 3.0}


def test_a_study_draws_its_noise_from_the_jobs_of_its_own_size() -> None:
    """Ten 40-slice jobs alone with 1 s of work, ten 47-slice ones with 4 s: the sizes
    are too close for a slope (service_time.MIN_SPREAD), so both sizes share one flat
    line, and pooled ratios would give a 40-slice study 4 s of work half the time (the
    quiet traces' URGENT p50 miss, 2026-12-02). Drawn by size, each study gets its own
    size's work."""
    import numpy as np

    from radserve.turnaround.plan import ModelSampler

    runs = [
        JobRun(OUT, 10.0 * i, 10.0 * i, 10.0 * i + work, slices, {"ingest": work, RUN: work})
        for i, (slices, work) in enumerate([(40, 1.0), (47, 4.0)] * 10)
    ]
    model = solo_model(runs, 2, pipeline="p", device="cpu", precision="fp32")
    steps = ModelSampler(model, "p", "cpu", "fp32")._steps
    assert steps(40)["ingest"] == pytest.approx(steps(47)["ingest"], rel=0.2)  # one line
    rng = np.random.default_rng(0)
    for slices, work in ((40, 1.0), (47, 4.0)):
        by_size = ModelSampler(model, "p", "cpu", "fp32")
        assert {round(by_size.service(rng, slices).cpu_pre_s, 6) for _ in range(50)} == {work}
    pooled = ModelSampler(model, "p", "cpu", "fp32", by_size=False)
    drawn = {round(pooled.service(rng, 40).cpu_pre_s, 1) for _ in range(200)}
    assert len(drawn) == 2 and max(drawn) > 2.0  # the 47-slice jobs' work drawn too


def test_jobs_that_shared_the_host_count_less_than_jobs_alone() -> None:
    """Ten jobs of one size, five alone (2 s of work) and five that ran in pairs on one
    core (each 4 s of wall time, 2 s alone: one thread of the other running beside
    it): the draws weigh each by exp(-threads of others / SHARED_THREADS)."""
    import numpy as np

    from radserve.turnaround.plan import SHARED_THREADS, ModelSampler

    alone = [_run(OUT, 10.0 * i, 10.0 * i + 2.0, ingest=2.0) for i in range(5)]
    pairs = [
        _run(OUT, 100.0 + 10.0 * (i // 2), 104.0 + 10.0 * (i // 2), ingest=4.0) for i in range(6)
    ]
    model = solo_model(alone + pairs, 1, pipeline="p", device="cpu", precision="fp32")
    assert [round(w.shared, 6) for w in model.work] == [0.0] * 5 + [1.0] * 6
    ratios, p = ModelSampler(model, "p", "cpu", "fp32").size_ratios(40)
    assert ratios == pytest.approx(np.ones(11))  # 2 s of work each, alone or divided out
    assert p[0] / p[-1] == pytest.approx(np.exp(1.0 / SHARED_THREADS))
    assert p.sum() == pytest.approx(1.0)


def test_the_division_is_made_consistent_with_the_simulated_sharing() -> None:
    """One core, two CPU-only jobs arriving together: A measured 4 s, B 2 s. Alone A
    needs 3 s and B 1 s (both at half speed until B ends at 2 s, then A alone). The
    mean field spreads B's demand over A's whole run (A's others 0.5: slowdown 1.5) and
    takes too much out of A (2.67 s); consistent with the simulation, A is 3 s again
    and B stays 1 s (session 15: routine jobs planned 13-35 % short at p50)."""
    a, b = _run(OUT, 0.0, 4.0, ingest=4.0), _run(OUT, 0.0, 2.0, ingest=2.0)
    mean_field = [
        solo_timings(r, s) for r, s in zip([a, b], slowdowns([a, b], cores=1), strict=True)
    ]
    assert mean_field[0]["ingest"] == pytest.approx(8 / 3)
    host = SimConfig(1, 2, PLAIN, urgent_lane=False, host_cores=1)
    fixed = consistent_timings([a, b], mean_field, host)
    assert fixed[0]["ingest"] == pytest.approx(3.0, rel=0.01)
    assert fixed[1]["ingest"] == pytest.approx(1.0, rel=0.01)
    assert fixed[0][RUN] == fixed[0]["ingest"]
    model = solo_model([a, b], 1, pipeline="p", device="cpu", precision="fp32", host=host)
    assert sorted(w.seconds for w in model.work) == pytest.approx([1.0, 3.0], rel=0.01)
