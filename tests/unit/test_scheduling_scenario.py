"""The issue's scenario, deterministically (fake clock, dispatch log, no sleeps): twenty
OUTPATIENT studies are queued and running; one URGENT study arrives mid-way. From its
arrival on, no OUTPATIENT batch is dispatched until every URGENT batch has been."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from tests.factories.scheduling_fakes import FakeSession, RecordingHooks, fake_work

from radserve.config import SchedulerSettings
from radserve.scheduling import (
    BatchDispatch,
    Dispatch,
    FakeClock,
    JobRequest,
    JobState,
    PriorityClass,
    Scheduler,
    run_serial,
)

URG, OUT = PriorityClass.URGENT, PriorityClass.OUTPATIENT
N_ROUTINE, BATCHES = 20, 4


@dataclass(frozen=True)
class Entry:
    at: float
    device: bool
    jobs: tuple[str, ...]


def _scenario(
    config: SchedulerSettings, arrive_after: int
) -> tuple[list[Entry], int, RecordingHooks]:
    clock = FakeClock()
    hooks = RecordingHooks()
    scheduler = Scheduler(config, clock=clock, hooks=hooks)
    session = FakeSession(clock, seconds_per_call=0.1)
    for n in range(N_ROUTINE):
        work = fake_work(session, BATCHES, base=100.0 * n, clock=clock, cpu_seconds=0.05)
        scheduler.submit(JobRequest(f"out{n:02d}", work, OUT))
    log: list[Entry] = []
    arrival: list[int] = []

    def on_dispatch(d: Dispatch) -> None:
        if isinstance(d, BatchDispatch):
            log.append(Entry(clock.now(), True, tuple(p.job_id for p in d.parts)))
        else:
            log.append(Entry(clock.now(), False, (d.job_id,)))
        device_batches = sum(e.device for e in log)
        if not arrival and device_batches == arrive_after:
            arrival.append(len(log))  # entries from here on came after the arrival
            work = fake_work(session, BATCHES, base=-1000.0, clock=clock, cpu_seconds=0.05)
            scheduler.submit(JobRequest("urgent", work, URG))

    run_serial(scheduler, on_dispatch=on_dispatch)
    assert arrival, "the URGENT study never arrived"
    return log, arrival[0], hooks


@pytest.mark.parametrize("arrive_after", [1, 7, 23])
def test_urgent_batches_all_go_before_any_further_outpatient_batch(arrive_after: int) -> None:
    log, arrived, hooks = _scenario(SchedulerSettings(), arrive_after)
    after = log[arrived:]
    urgent_batches = [i for i, e in enumerate(after) if e.device and "urgent" in e.jobs]
    assert len(urgent_batches) >= 1
    last_urgent = urgent_batches[-1]
    routine_batches = [i for i, e in enumerate(after) if e.device and "urgent" not in e.jobs]
    assert routine_batches and min(routine_batches) > last_urgent
    # URGENT batches ran on their own (never mixed with routine work) ...
    assert all(after[i].jobs == ("urgent",) for i in urgent_batches)
    # ... and every URGENT sample went through before routine work resumed.
    ran = sum(len(after[i].jobs) for i in urgent_batches)
    assert ran <= BATCHES
    # While the URGENT study was unfinished, no routine work of any kind started.
    done_at = hooks.final("urgent").at  # type: ignore[union-attr]
    assert all(e.jobs == ("urgent",) for e in after if e.at < done_at)
    # It overtook a half-finished routine study at a batch boundary.
    before = {j for e in log[:arrived] if e.device for j in e.jobs}
    later = {j for e in after[last_urgent:] if e.device for j in e.jobs}
    assert before & later, "no routine study was interrupted mid-way"
    # Everything finished; the URGENT study within its TAT.
    finals = [e for e in hooks.states if e.state.terminal]
    assert len(finals) == N_ROUTINE + 1
    assert all(e.state is JobState.SUCCEEDED for e in finals)
    assert not [m for m in hooks.misses if m.job_id == "urgent"]


def test_without_exclusivity_urgent_still_wins_every_batch_boundary() -> None:
    """urgent_exclusive=False keeps the device busy with routine batches while the
    URGENT study is ingested; once its batches are ready, each one goes first."""
    log, arrived, hooks = _scenario(SchedulerSettings(urgent_exclusive=False), 7)
    after = log[arrived:]
    first_urgent = next(i for i, e in enumerate(after) if e.device and "urgent" in e.jobs)
    last_urgent = max(i for i, e in enumerate(after) if e.device and "urgent" in e.jobs)
    between = [e for e in after[first_urgent:last_urgent] if e.device and "urgent" not in e.jobs]
    assert between == []
    assert hooks.final("urgent").state is JobState.SUCCEEDED  # type: ignore[union-attr]
