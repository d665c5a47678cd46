"""The planner's simulation against queueing theory (long runs, fixed seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.factories.simulation import PLAIN

from radserve.config import SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.turnaround.simulate import (
    Arrival,
    JobService,
    SimConfig,
    poisson_trace,
    simulate,
    simulate_jobs,
)

U, OUT = PriorityClass.URGENT, PriorityClass.OUTPATIENT
INP = PriorityClass.INPATIENT


def _exponential(mean: float):  # type: ignore[no-untyped-def]
    def sample(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(0.0, (float(rng.exponential(mean)),), 0.0)

    return sample


def test_mm1_mean_time_in_system_matches_theory() -> None:
    lam, mu = 0.5, 1.0  # rho 0.5: W = 1 / (mu - lam) = 2 s, Wq = rho / (mu - lam) = 1 s
    trace = poisson_trace({OUT: lam}, 40_000, seed=3)
    result = simulate(trace, _exponential(1 / mu), SimConfig(1, 1, PLAIN), seed=4, warmup_s=500)
    out = result.classes[OUT]
    assert out.jobs > 19_000
    assert abs(out.tat_mean_s - 2.0) / 2.0 < 0.05
    assert abs(out.wait_mean_s + (out.tat_mean_s - out.wait_mean_s) - 2.0) < 0.1
    assert abs(result.device_utilisation - 0.5) < 0.02
    # M/M/1 time in system is exponential with rate mu - lam: p95 = ln(20) / 0.5
    assert abs(out.tat_p95_s - np.log(20) / 0.5) / (np.log(20) / 0.5) < 0.06


def test_mm2_matches_erlang_c() -> None:
    lam, mu, c = 1.4, 1.0, 2  # rho 0.7 per device
    a = lam / mu
    rho = a / c
    p0 = 1 / (sum(a**k / math.factorial(k) for k in range(c)) + a**c / (2 * (1 - rho)))
    erlang_c = a**c / (2 * (1 - rho)) * p0
    expected = erlang_c / (c * mu - lam) + 1 / mu
    trace = poisson_trace({OUT: lam}, 30_000, seed=5)
    result = simulate(trace, _exponential(1 / mu), SimConfig(c, 1, PLAIN), seed=6, warmup_s=500)
    assert abs(result.classes[OUT].tat_mean_s - expected) / expected < 0.06


def test_two_classes_follow_non_preemptive_priority_theory() -> None:
    """Cobham: class k waits W0 / ((1 - s_{k-1}) (1 - s_k)), W0 = sum lam_i E[S^2] / 2;
    single-batch jobs make the device a non-preemptive priority queue."""
    lam_u, lam_o, mean = 0.2, 0.3, 1.0
    w0 = (lam_u + lam_o) * 2 * mean**2 / 2
    s_u, s_all = lam_u * mean, (lam_u + lam_o) * mean
    expect_u = w0 / (1 - s_u) + mean
    expect_o = w0 / ((1 - s_u) * (1 - s_all)) + mean
    trace = poisson_trace({U: lam_u, OUT: lam_o}, 60_000, seed=8)
    result = simulate(trace, _exponential(mean), SimConfig(1, 1, PLAIN), seed=9, warmup_s=500)
    assert abs(result.classes[U].tat_mean_s - expect_u) / expect_u < 0.06
    assert abs(result.classes[OUT].tat_mean_s - expect_o) / expect_o < 0.06


def test_same_seed_same_answer_and_urgent_overtakes_at_batch_boundaries() -> None:
    def sample(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(0.1, (0.2,) * 10, 0.1)  # 2 s of device time in 10 batches

    config = SimConfig(1, 2, SchedulerSettings())
    trace = poisson_trace({U: 0.05, OUT: 0.3}, 3_000, seed=1)
    a = simulate(trace, sample, config, seed=2)
    b = simulate(trace, sample, config, seed=2)
    assert a.as_dict() == b.as_dict()
    # a typical emergency waits at most for the routine batch and CPU stage in flight
    assert a.classes[U].tat_p50_s <= 2.2 + 0.2 + 0.1 + 1e-6
    assert a.classes[U].tat_mean_s < a.classes[OUT].tat_mean_s


def test_a_cpu_device_shares_the_host_cores_with_the_cpu_stages() -> None:
    """Four jobs at once, 2 s of CPU stages and 2 s of batches each. On separate hardware
    the device works while the CPU pool does; on a 2-core CPU host a batch runs on both
    cores, so the work adds up: 4 x (2 x 1 core-s + 2 x 2 core-s) / 2 cores = 12 s at
    least before the last job is done, against 9 s apart."""
    from radserve.turnaround.simulate import Arrival

    def sample(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(1.0, (1.0, 1.0), 1.0)

    trace = [Arrival(0.0, OUT) for _ in range(4)]
    separate = simulate(trace, sample, SimConfig(1, 2, PLAIN), seed=0)
    shared = simulate(trace, sample, SimConfig(1, 2, PLAIN, host_cores=2), seed=0)
    assert separate.classes[OUT].jobs == shared.classes[OUT].jobs == 4
    # the last job: above the 99th percentile's interpolation, at least the work bound
    assert shared.classes[OUT].tat_p99_s >= 11.9 > separate.classes[OUT].tat_p99_s
    assert shared.classes[OUT].tat_mean_s > separate.classes[OUT].tat_mean_s


def test_running_units_share_the_cores_as_the_os_does_not_in_turns() -> None:
    """A 2-thread batch (2 s alone) and a 1-thread CPU stage (2 s alone) start together
    on 2 cores: 3 threads, each unit at 2/3 of its speed, both done at 3 s; taking turns
    (the batch waiting for the stage) would end at 4 s. A lone CPU stage on 2 cores runs
    at full speed (it cannot use the second core)."""
    import simpy

    from radserve.turnaround.simulate import _SharedCores

    env = simpy.Environment()
    cores = _SharedCores(env, 2)
    done: dict[str, float] = {}

    def unit(name: str, seconds: float, threads: int, at: float = 0.0):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        yield cores.run(seconds, threads)
        done[name] = env.now

    env.process(unit("batch", 2.0, 2))
    env.process(unit("stage", 2.0, 1))
    env.process(unit("alone", 1.0, 1, at=10.0))
    env.run()
    assert done["batch"] == pytest.approx(3.0) and done["stage"] == pytest.approx(3.0)
    assert done["alone"] == pytest.approx(11.0)


def test_the_urgent_lane_runs_urgent_cpu_stages_while_the_pool_is_busy() -> None:
    """One CPU worker busy with a long routine stage: an URGENT job's stage waits for it
    without the lane, and starts at once with it (the server's executor has the lane)."""
    from radserve.turnaround.simulate import Arrival

    def sample(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(1.0, (), 0.0) if cls is U else JobService(10.0, (), 0.0)

    trace = [Arrival(0.0, OUT), Arrival(0.5, U)]
    without = simulate(trace, sample, SimConfig(1, 1, PLAIN, urgent_lane=False), seed=0)
    lane = simulate(trace, sample, SimConfig(1, 1, PLAIN), seed=0)
    assert without.classes[U].tat_mean_s == pytest.approx(10.5)
    assert lane.classes[U].tat_mean_s == pytest.approx(1.0)


def test_unmeasured_arrivals_load_the_host_but_are_not_counted() -> None:
    """A benchmark's unmeasured fillers keep the stream going: they delay the measured
    jobs (one device, FIFO), but their own turnaround is not in the statistics."""
    fixed = JobService(0.0, (10.0,), 0.0)
    measured = [Arrival(0.0, OUT, fixed), Arrival(5.0, OUT, fixed)]
    fillers = [Arrival(6.0, U, fixed, measured=False)]  # served before the 2nd measured
    alone = simulate(measured, _exponential(1.0), SimConfig(1, 1, PLAIN), seed=0)
    config = SimConfig(1, 1, SchedulerSettings(urgent_exclusive=False, max_running=1000))
    both = simulate(measured + fillers, _exponential(1.0), config, seed=0)
    assert set(both.classes) == {OUT}  # the URGENT filler is not counted
    assert both.classes[OUT].jobs == 2
    assert alone.classes[OUT].tat_p50_s == 12.5  # TATs 10 and 15
    assert both.classes[OUT].tat_p50_s == 17.5  # TATs 10 and 25: the filler went first


def test_a_routine_cpu_stage_pauses_while_urgent_work_runs() -> None:
    """yield_to_urgent: a routine 4 s CPU stage (one core of two) is running when a 2 s
    URGENT stage arrives at 1 s. Paused, it leaves the URGENT stage alone and ends
    2 s late (at 6 s); without yielding both run at full speed (2 cores, 2 threads)."""

    def sample(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(2.0, (), 0.0) if cls is U else JobService(4.0, (), 0.0)

    trace = [Arrival(0.0, OUT), Arrival(1.0, U)]
    config = SchedulerSettings(urgent_exclusive=False)
    yields = simulate(trace, sample, SimConfig(1, 1, config, host_cores=2), seed=0)
    plain = SchedulerSettings(urgent_exclusive=False, yield_to_urgent=False)
    runs_on = simulate(trace, sample, SimConfig(1, 1, plain, host_cores=2), seed=0)
    assert yields.classes[U].tat_mean_s == pytest.approx(2.0)
    assert yields.classes[OUT].tat_mean_s == pytest.approx(6.0)
    assert runs_on.classes[OUT].tat_mean_s == pytest.approx(4.0)


def test_two_equal_jobs_sharing_one_core_finish_at_twice_their_time() -> None:
    def sample(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(3.0, (), 0.0)

    trace = [Arrival(0.0, OUT), Arrival(0.0, OUT)]
    result = simulate(trace, sample, SimConfig(1, 2, PLAIN, host_cores=1), seed=0)
    assert result.classes[OUT].tat_p50_s == pytest.approx(6.0)
    assert result.classes[OUT].tat_p95_s == pytest.approx(6.0)


def test_a_paused_worker_lends_its_thread_to_urgent_cpu_work() -> None:
    """One CPU thread, no URGENT lane: a routine 10 s stage runs when a 1 s URGENT stage
    arrives at 1 s. The routine stage pauses and its thread runs the URGENT stage
    (done at 2 s), then resumes (done at 11 s), as the server's workers do at a
    checkpoint; without yielding the URGENT stage waits for the thread (done at 11 s)."""

    def sample(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(1.0, (), 0.0) if cls is U else JobService(10.0, (), 0.0)

    trace = [Arrival(0.0, OUT), Arrival(1.0, U)]
    lends = SchedulerSettings(urgent_exclusive=False)
    result = simulate(trace, sample, SimConfig(1, 1, lends, urgent_lane=False), seed=0)
    assert result.classes[U].tat_mean_s == pytest.approx(1.0)
    assert result.classes[OUT].tat_mean_s == pytest.approx(11.0)
    waits = simulate(trace, sample, SimConfig(1, 1, PLAIN, urgent_lane=False), seed=0)
    assert waits.classes[U].tat_mean_s == pytest.approx(10.0)


def test_urgent_work_runs_at_its_solo_speed_while_routine_cpu_stages_pause() -> None:
    """The scheduler's ``yield_to_urgent`` on a 2-core host with two CPU workers and the
    URGENT lane: two routine 10 s CPU stages hold both cores when a 2 s URGENT stage
    arrives at 1 s. Paused at their checkpoints, they leave the URGENT stage the cores
    (done in 2 s, as alone) and end 2 s late (12 s); without yielding, three threads
    share two cores (URGENT 3 s, routine 11 s). A routine device batch is not a
    checkpointed stage: it runs on, and the URGENT stage shares the cores with it."""

    def stages(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(2.0, (), 0.0) if cls is U else JobService(10.0, (), 0.0)

    def batch(rng: np.random.Generator, cls: PriorityClass) -> JobService:
        return JobService(2.0, (), 0.0) if cls is U else JobService(0.0, (10.0,), 0.0)

    trace = [Arrival(0.0, OUT), Arrival(0.0, OUT), Arrival(1.0, U)]
    host = SimConfig(1, 2, SchedulerSettings(), host_cores=2)
    paused = simulate(trace, stages, host, seed=0)
    assert paused.classes[U].tat_mean_s == pytest.approx(2.0)
    assert paused.classes[OUT].tat_mean_s == pytest.approx(12.0)
    plain = SchedulerSettings(urgent_exclusive=False, yield_to_urgent=False)
    shared = simulate(trace, stages, SimConfig(1, 2, plain, host_cores=2), seed=0)
    assert shared.classes[U].tat_mean_s == pytest.approx(3.0)
    assert shared.classes[OUT].tat_mean_s == pytest.approx(11.0)
    beside_batch = simulate(trace[1:], batch, host, seed=0)
    assert beside_batch.classes[U].tat_mean_s == pytest.approx(3.0)  # 3 threads, 2 cores


def test_a_waiting_job_starts_only_when_a_cpu_thread_takes_its_first_stage() -> None:
    """At most 2 routine jobs started, one CPU thread, the device apart. A (OUTPATIENT,
    0 s) ingests 1 s, then runs 2 s on the device; B (OUTPATIENT, 0.1 s) waits, as the
    thread is busy; D (INPATIENT, 0.3 s) arrives. The scheduler starts a waiting job
    only when a CPU thread takes its first stage (``JobBook.stage_unit``), so when A's
    ingest ends at 1 s the thread starts D, the better class: D's TAT 1.7 s; B starts
    when D ends (2 s, TAT 2.9 s). The simulation before 2026-12-03 started B at its arrival (a slot
    was free) although no thread took it: B held the second slot and D waited for B's
    ingest to end (D's TAT 2.7 s, B's 1.9 s)."""
    sched = PLAIN.model_copy(update={"max_running": 2})
    config = SimConfig(1, 1, sched, urgent_lane=False)
    trace = [
        Arrival(0.0, OUT, JobService(1.0, (2.0,), 0.0), measured=False),
        Arrival(0.1, OUT, JobService(1.0, (), 0.0)),
        Arrival(0.3, INP, JobService(1.0, (), 0.0)),
    ]
    result = simulate(trace, lambda rng, cls: JobService(0.0, (), 0.0), config)
    assert result.classes[INP].tat_p50_s == pytest.approx(1.7)
    assert result.classes[INP].wait_mean_s == pytest.approx(0.7)
    assert result.classes[OUT].tat_p50_s == pytest.approx(2.9)  # B: 2.0 to 3.0


def test_simulate_jobs_gives_each_job_of_the_same_run_in_arrival_order() -> None:
    """The job-by-job view (tools/planner_oracle.py) is the run :func:`simulate` makes:
    one CPU thread, the device apart, three jobs given out of order."""
    config = SimConfig(1, 1, PLAIN, urgent_lane=False)
    trace = [
        Arrival(0.5, OUT, JobService(1.0, (), 0.0)),
        Arrival(0.0, OUT, JobService(1.0, (2.0,), 0.0)),
        Arrival(0.2, INP, JobService(0.5, (), 0.0)),
    ]
    jobs = simulate_jobs(trace, _exponential(1.0), config)
    assert [(j.index, j.cls, j.arrival) for j in jobs] == [
        (0, OUT, 0.0),
        (1, INP, 0.2),
        (2, OUT, 0.5),
    ]
    times = [t for j in jobs for t in (j.started, j.finished)]
    assert times == pytest.approx([0.0, 3.0, 1.0, 1.5, 1.5, 2.5])
    result = simulate(trace, _exponential(1.0), config)
    assert result.classes[INP].tat_p50_s == pytest.approx(1.3)


def test_simulate_jobs_counts_the_wall_time_each_jobs_units_ran_on_the_shared_cores() -> None:
    """The counterpart of a job's measured stage timings (tools/planner_oracle.py
    compares them to see how much sharing the division took out and the simulation put
    back): two CPU stages of 1 s on one core take 2 s of wall each; a job alone keeps
    its solo seconds, CPU and batch apart."""
    config = SimConfig(1, 2, PLAIN, urgent_lane=False, host_cores=1)
    trace = [
        Arrival(0.0, OUT, JobService(1.0, (), 0.0)),
        Arrival(0.0, OUT, JobService(1.0, (), 0.0)),
        Arrival(5.0, OUT, JobService(0.5, (2.0,), 0.25)),
    ]
    jobs = simulate_jobs(trace, _exponential(1.0), config)
    walls = [(j.cpu_wall, j.device_wall) for j in jobs]
    assert walls == [
        pytest.approx((2.0, 0.0)),
        pytest.approx((2.0, 0.0)),
        pytest.approx((0.75, 2.0)),
    ]
    assert [j.finished for j in jobs] == pytest.approx([2.0, 2.0, 7.75])
