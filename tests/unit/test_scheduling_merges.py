"""Merges beside a GPU: a slice task's batches merge on several CPU threads at once (up to
``merge_threads_for``), a task whose outputs overlap and any task on a CPU session one at
a time; the study's result is the same either way."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tests.factories.scheduling_fakes import FakeSession, fake_work

from radserve.scheduling import (
    FakeClock,
    JobRequest,
    PriorityClass,
    Scheduler,
    execute,
)
from radserve.scheduling.dispatch import MergeDispatch


class GpuSession(FakeSession):
    """A session whose runtime says it runs on a GPU of a host with ``cores`` cores."""

    def __init__(self, cores: int) -> None:
        super().__init__()
        self.runtime = SimpleNamespace(device="cuda:0", host=SimpleNamespace(usable_cores=cores))


def _merges_in_flight(session: FakeSession, *, disjoint: bool, batches: int = 6) -> int:
    """Run a one-job study until its outputs wait to merge; how many merges the CPU pool
    is handed before any completes. Then finish the study and check every batch merged."""
    scheduler = Scheduler(clock=FakeClock())
    work = fake_work(session, batches)
    work.steps[0].task.merges_in_parallel = disjoint  # type: ignore[attr-defined]
    scheduler.submit(JobRequest("a", work, PriorityClass.OUTPATIENT))
    held: list[MergeDispatch] = []
    for _ in range(200):
        device = scheduler.next_dispatch("gpu")
        if device is not None:
            scheduler.complete(device, execute(device))
            continue
        cpu = scheduler.next_cpu_dispatch()
        if cpu is None:
            break
        if isinstance(cpu, MergeDispatch):
            held.append(cpu)  # in flight: not completed yet
            continue
        scheduler.complete(cpu, execute(cpu))
    at_once = len(held)
    for merge in held:
        scheduler.complete(merge, execute(merge))
    while (d := scheduler.next_cpu_dispatch() or scheduler.next_dispatch("gpu")) is not None:
        scheduler.complete(d, execute(d))
    assert sorted(work.steps[0].task.accepted) == list(range(batches))
    assert work.log == ["ingest", "report"]  # the job went on past its step
    return at_once


@pytest.mark.parametrize(("cores", "expected"), [(16, 4), (64, 4), (8, 2), (2, 1)])
def test_a_slice_task_beside_a_gpu_merges_several_batches_at_once(
    cores: int, expected: int
) -> None:
    assert _merges_in_flight(GpuSession(cores), disjoint=True) == expected


def test_overlapping_outputs_or_a_cpu_session_merge_one_at_a_time() -> None:
    assert _merges_in_flight(GpuSession(16), disjoint=False) == 1
    assert _merges_in_flight(FakeSession(), disjoint=True) == 1
