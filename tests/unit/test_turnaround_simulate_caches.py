"""The simulation's shortcuts change no answer: the ranking kept until a job arrives,
finishes or may age, and an idle worker's search skipped while nothing changed
(radserve.turnaround.simulate._Sim._ranked / _take), against every worker ranking and
searching afresh at every wake-up, as the simulation did before 2026-12-04."""

from __future__ import annotations

import pytest

from radserve.config import ClassTats, SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.inference.providers import CPU_MAX_BATCH
from radserve.turnaround import simulate
from radserve.turnaround.plan import ModelSampler, find_devices
from radserve.turnaround.service_time import ServiceTimeModel, StudySize
from radserve.turnaround.simulate import SimConfig, poisson_trace, simulate_jobs

U, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT
SCHEDULER = SchedulerSettings().capped(CPU_MAX_BATCH)  # as `plan` runs a CPU device
# routine targets of a minute or two: jobs of ~15 s age (effective_class) while they queue
SHORT_TATS = SCHEDULER.model_copy(update={"tat_s": ClassTats(inpatient=60, outpatient=120)})


def _sampler(*, fine: bool) -> ModelSampler:
    """~15 s of device time per job in batches of two slices (`radserve plan`'s tests)."""
    model = ServiceTimeModel()
    for slices in (100, 200, 300, 400):
        timings = {"ingest": 0.01 * slices, "organs: infer": 0.05 * slices, "report": 1.0}
        if fine:
            timings |= {"organs: prepare": 0.004 * slices, "organs: merge": 0.002 * slices}
        model.observe(
            pipeline="ct",
            device="cpu",
            precision="fp32",
            size=StudySize(slices),
            timings={**timings, "run": sum(timings.values())},
        )
    return ModelSampler(model, "ct", "cpu", "fp32", batch_slices=2, fine=fine)


def _afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker ranks the jobs and searches them itself at every wake-up."""

    def rank_every_time(sim: simulate._Sim) -> simulate._Ranking:
        return sim._rank_now()

    monkeypatch.setattr(simulate._Sim, "_ranked", rank_every_time)
    monkeypatch.setattr(simulate._Sim, "_take", simulate._Sim._find)


@pytest.mark.parametrize(
    ("rates_per_h", "hours", "seed", "devices", "cores", "fine", "scheduler"),
    [
        # URGENT beside a routine queue: exclusivity and the URGENT lane
        ({U: 60, OUT: 540}, 0.15, 9, 3, None, False, SCHEDULER),
        # INPATIENT and OUTPATIENT jobs age while they wait, some into the URGENT class
        ({U: 10, INP: 120, OUT: 120}, 0.2, 2, 1, None, False, SHORT_TATS),
        # the device on the host's cores: processor sharing and routine stages paused
        ({U: 20, OUT: 150}, 0.2, 3, 1, 2, False, SCHEDULER),
        # the server's own units: preparations and merges, the feeder threads
        ({U: 20, INP: 60, OUT: 120}, 0.15, 4, 1, None, True, SCHEDULER),
    ],
)
def test_every_job_runs_as_when_every_worker_looks_afresh(
    monkeypatch: pytest.MonkeyPatch,
    rates_per_h: dict[PriorityClass, float],
    hours: float,
    seed: int,
    devices: int,
    cores: int | None,
    fine: bool,
    scheduler: SchedulerSettings,
) -> None:
    trace = poisson_trace({c: r / 3600 for c, r in rates_per_h.items()}, hours * 3600, seed)
    config = SimConfig(devices, 2 * devices, scheduler, host_cores=cores)
    sampler = _sampler(fine=fine)
    kept = simulate_jobs(trace, sampler, config, seed=seed)
    _afresh(monkeypatch)
    assert simulate_jobs(trace, sampler, config, seed=seed) == kept
    # some jobs waited to start: the policy chose between them
    assert any(j.finished is not None and j.started != j.arrival for j in kept)


def test_the_device_search_is_the_same_as_when_every_worker_looks_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`plan --find-devices`: the counts tried, their TAT percentiles and busy shares."""
    trace = poisson_trace({U: 60 / 3600, OUT: 540 / 3600}, 0.15 * 3600, 5)
    sampler = _sampler(fine=False)
    search = {
        "targets": {U: 120.0},
        "cpu_workers_per_device": 2,
        "scheduler": SCHEDULER,
        "seed": 5,
        "warmup_s": 60.0,
    }
    best, tried, first = find_devices(trace, sampler, **search)  # type: ignore[arg-type]
    _afresh(monkeypatch)
    again = find_devices(trace, sampler, **search)  # type: ignore[arg-type]
    assert [p.as_dict() for p in again[1]] == [p.as_dict() for p in tried]
    assert (again[0], again[2]) == (best, first)
    assert best is not None and tried[0].devices == first
