"""The simulation's waiting jobs kept per class (radserve.turnaround.waiting) hand out
every unit as the straightforward scan did: every unfinished job ranked by the
scheduler's key (``effective_class``: aging, then EDF) and walked best first, as
``_Sim._find`` did before 2026-12-06. Checked at every dispatch of seeded random
loads (queues of tens, jobs aging while they wait and while they run, URGENT
exclusivity, shared cores, the server's own units), and ``radserve plan`` answers
byte for byte as the scan's code did (its output captured before the change)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli
from radserve.config import ClassTats, SchedulerSettings
from radserve.domain.priority import PriorityClass
from radserve.inference.providers import CPU_MAX_BATCH
from radserve.scheduling.selection import may_start
from radserve.scheduling.state import effective_class
from radserve.turnaround import simulate
from radserve.turnaround.plan import ModelSampler
from radserve.turnaround.service_time import ServiceTimeModel, StudySize
from radserve.turnaround.simulate import SimConfig, poisson_trace, simulate_jobs
from radserve.turnaround.waiting import WaitingJobs

U, INP, OUT = PriorityClass.URGENT, PriorityClass.INPATIENT, PriorityClass.OUTPATIENT
SCHEDULER = SchedulerSettings().capped(CPU_MAX_BATCH)
# routine targets of a minute or two: jobs of ~15 s age while they queue and while they run
SHORT_TATS = SCHEDULER.model_copy(update={"tat_s": ClassTats(inpatient=60, outpatient=120)})
GOLDEN = Path(__file__).parent.parent / "data" / "plan-golden"


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


def _scan(sim: simulate._Sim, kind: str) -> tuple[object, str] | None:
    """The unit a worker of ``kind`` gets, found as before 2026-12-06: every unfinished
    job (waiting or started) ranked afresh and walked best first. Side-effect free: a
    waiting job it would start is answered with its first stage, as the old walk did
    (a job just started has no feed work and a free first stage)."""
    now, sched = sim.env.now, sim.config.scheduler
    jobs = list(sim.jobs.values())
    if sched.urgent_exclusive and any(j.cls is U for j in jobs):
        jobs = [j for j in jobs if j.cls is U]
    keyed = []
    for job in jobs:
        eff = effective_class(job.cls, job.deadline, now, sched)
        keyed.append(((eff.rank, eff is U and job.cls is not U, job.deadline, job.seq), eff, job))
    keyed.sort(key=lambda k: k[0])
    order = [job for _, _, job in keyed]
    tiers: dict[PriorityClass, list[simulate._Job]] = {}
    for _, eff, job in keyed:
        tiers.setdefault(eff, []).append(job)
    if kind == "device":
        return next(
            ((j, "batch") for j in order if j.step and j.step.ready and not j.step.on_device), None
        )
    if kind == "urgent":
        order = [j for j in order if j.cls is U]
        tiers = {U: order} if order else {}
    if kind == "feed":
        return next(((j, u) for j in order if (u := sim._feed(j, order)) is not None), None)
    started = sum(1 for j in sim.jobs.values() if j.started is not None and j.cls is not U)
    feed_first = sim.config.feed_first
    for tier in tiers.values():
        for job in tier if feed_first else ():
            if (unit := sim._feed(job, order)) is not None:
                return job, unit
        for job in tier:
            if job.queued:
                if may_start(job.cls, started, sched):
                    return job, "stage"
                continue
            if not feed_first and (unit := sim._feed(job, order)) is not None:
                return job, unit
            if job.stage is not None and not job.stage_busy:
                return job, "stage"
    return None


def _named(unit: tuple[simulate._Job, str] | None) -> str:
    return "nothing" if unit is None else f"{unit[1]} of {unit[0].cls.value} job {unit[0].seq}"


@pytest.mark.parametrize(
    ("rates_per_h", "hours", "seed", "devices", "cores", "fine", "scheduler"),
    [
        # a routine queue of tens behind max_running, URGENT overtaking it
        ({U: 30, INP: 300, OUT: 600}, 0.2, 1, 2, None, False, SCHEDULER),
        # jobs age while they wait (some into URGENT) and while they run
        ({U: 20, INP: 300, OUT: 300}, 0.3, 2, 2, None, False, SHORT_TATS),
        # the device on the host's cores: processor sharing, routine stages paused
        ({U: 30, INP: 200, OUT: 250}, 0.3, 3, 1, 2, False, SHORT_TATS),
        # the server's own units: preparations and merges, the feeder threads
        ({U: 20, INP: 250, OUT: 250}, 0.2, 4, 1, None, True, SHORT_TATS),
    ],
)
def test_every_dispatch_is_the_one_the_full_scan_makes(
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
    find = simulate._Sim._find
    seen: Counter[str] = Counter()

    def checked(sim: simulate._Sim, kind: str) -> tuple[simulate._Job, str] | None:
        want = _scan(sim, kind)
        waiting = len(sim.waiting)
        got = find(sim, kind)
        assert got == want, f"{kind} at {sim.env.now}: {_named(got)} != {_named(want)}"
        seen["dispatches"] += 1
        seen["longest queue"] = max(seen["longest queue"], waiting)
        if got is not None and got[0].started == sim.env.now and got[1] == "stage":
            job = got[0]
            if effective_class(job.cls, job.deadline, sim.env.now, scheduler) is not job.cls:
                seen["started aged"] += 1
        return got

    monkeypatch.setattr(simulate._Sim, "_find", checked)
    jobs = simulate_jobs(trace, _sampler(fine=fine), config, seed=seed)
    assert all(j.finished is not None for j in jobs)
    # the walk had choices to make: a long queue, and (with short TATs) jobs that aged
    # before they started
    assert seen["dispatches"] > 1000
    assert seen["longest queue"] >= 30
    if scheduler is SHORT_TATS:
        assert seen["started aged"] > 0


class _Job:
    def __init__(self, cls: PriorityClass, deadline: float, seq: int) -> None:
        self.cls, self.deadline, self.seq = cls, deadline, seq


def test_a_class_waits_in_deadline_order_and_starts_from_its_head() -> None:
    waiting: WaitingJobs[_Job] = WaitingJobs(SHORT_TATS)
    first, second = _Job(OUT, 120.0, 0), _Job(OUT, 130.0, 2)
    waiting.add(first)
    waiting.add(_Job(INP, 65.0, 1))
    waiting.add(second)
    with pytest.raises(ValueError, match="must arrive in deadline order"):
        waiting.add(_Job(OUT, 125.0, 3))
    # OUTPATIENT ages with 30 s of slack left (a quarter of its 120 s)
    assert waiting.first(OUT, now=0.0) == (first, OUT)
    assert waiting.first(OUT, now=95.0) == (first, INP)
    assert waiting.first(U, now=0.0) is None
    with pytest.raises(ValueError, match="not the first waiting OUTPATIENT job"):
        waiting.start(second)
    waiting.start(first)
    assert waiting.first(OUT, now=95.0) == (second, OUT)
    assert len(waiting) == 2


@pytest.mark.parametrize(
    ("name", "args"),
    [
        # the device search; URGENT exclusivity beside a routine queue
        (
            "find-devices",
            "--rate urgent=60/h,outpatient=540/h --hours 0.3 --seed 5 --find-devices "
            "--target urgent=120s --host-cores 0",
        ),
        # 92 % busy, short TATs: routine jobs age while they wait and run, some miss
        (
            "aging",
            "--config {golden}/short.yaml --rate urgent=30/h,inpatient=200/h,outpatient=300/h "
            "--hours 0.5 --devices 2 --host-cores 0 --seed 6",
        ),
        # the devices on the host's cores (shared), short TATs
        (
            "shared-cores",
            "--config {golden}/short.yaml --rate urgent=20/h,inpatient=150/h,outpatient=250/h "
            "--hours 0.5 --devices 2 --host-cores 2 --seed 8",
        ),
    ],
)
def test_plan_answers_byte_for_byte_as_the_full_scan_did(
    tmp_path: Path, name: str, args: str
) -> None:
    """Each JSON was written by `radserve plan` at 77d8a2c (the full scan)."""
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--data-dir",
            str(tmp_path / "data"),
            "--service-times",
            str(GOLDEN / "model.json"),
            *args.format(golden=GOLDEN).split(),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == (GOLDEN / f"{name}.json").read_text()
