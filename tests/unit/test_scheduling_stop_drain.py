"""A stopping executor finishes the jobs whose device work is done: the stage running at
the stop (a report) completes, and the job's short stages after it (lineage, DICOM
results, publishing) run too, so its result is recorded; nothing else starts (no job, no
batch). Before, the workers stopped at the running unit's end and such a job stayed
running, to run again whole after the restart."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pytest
from tests.factories.scheduling_fakes import FakeSession, FakeTask, RecordingHooks
from tests.factories.waits import until

from radserve.inference.tasks import Task
from radserve.scheduling import (
    InProcessExecutor,
    JobEvent,
    JobRequest,
    JobState,
    PriorityClass,
    Scheduler,
)
from radserve.scheduling.work import CpuStage, DeviceStage, ModelKey, Stage

OUT = PriorityClass.OUTPATIENT
WAIT = 20.0  # seconds; never reached when things work


@dataclass
class TailWork:
    """ingest -> one device step -> postprocess -> report -> lineage; ``hold`` (a stage
    name) blocks in that stage until ``release`` is set, marking ``entered``."""

    session: FakeSession
    hold: str | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    log: list[str] = field(default_factory=list)
    _plan: list[Stage] | None = None

    @property
    def models(self) -> tuple[str, ...]:
        return ("organs",)

    def _cpu(self, name: str) -> CpuStage:
        def run() -> None:
            if name == self.hold:
                self.entered.set()
                assert self.release.wait(WAIT), "the test never released the stage"
            self.log.append(name)

        return CpuStage(name, run)

    def next_stage(self) -> Stage | None:
        if self._plan is None:
            model = ModelKey("organs", "1.0.0")
            device = DeviceStage("organs", model, cast(Task, FakeTask(2)), self.session)
            self._plan = [self._cpu("ingest"), device]
            self._plan += [self._cpu(n) for n in ("postprocess", "report", "lineage")]
        return self._plan.pop(0) if self._plan else None

    def result(self) -> object:
        return list(self.log)


class Hooks(RecordingHooks):
    def __init__(self) -> None:
        super().__init__()
        self.ended: dict[str, threading.Event] = {}

    def end_of(self, job_id: str) -> threading.Event:
        return self.ended.setdefault(job_id, threading.Event())

    def on_state(self, event: JobEvent) -> None:
        super().on_state(event)
        if event.state.terminal:
            self.end_of(event.job_id).set()


class HeldSession(FakeSession):
    """Blocks a batch once ``block`` is set, until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.block = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def run(self, batch: np.ndarray) -> np.ndarray:
        if self.block.is_set():
            self.entered.set()
            assert self.release.wait(WAIT)
        return super().run(batch)


@pytest.mark.parametrize("hold", ["postprocess", "report"])
def test_a_job_in_its_tail_at_the_stop_finishes_and_nothing_else_starts(hold: str) -> None:
    hooks = Hooks()
    scheduler = Scheduler(hooks=hooks)
    executor = InProcessExecutor(scheduler, cpu_workers=2)
    tail = TailWork(FakeSession(), hold=hold)
    device = HeldSession()
    device.block.set()
    on_device = TailWork(device)
    executor.start()
    stopper = threading.Thread(target=executor.stop)
    try:
        scheduler.submit(JobRequest("tail", tail, OUT))
        assert tail.entered.wait(WAIT)  # its last model's post-processing or its report
        scheduler.submit(JobRequest("on-device", on_device, OUT))
        assert device.entered.wait(WAIT)  # its first batch is on the device
        stopper.start()
        # once the stop has begun, a job that arrives does not start
        until(executor._stopping.is_set, "the stop to begin", WAIT, step=0.01)
        scheduler.submit(JobRequest("late", TailWork(FakeSession()), OUT))
        tail.release.set()
        device.release.set()
        stopper.join(WAIT)
        assert not stopper.is_alive()
    finally:
        tail.release.set()
        device.release.set()
        if stopper.ident is None:
            executor.stop()
    final = hooks.final("tail")
    assert final is not None and final.state is JobState.SUCCEEDED
    assert tail.log == ["ingest", "postprocess", "report", "lineage"]
    # the job with device work left stops at its batch boundary, the late one never starts
    assert hooks.final("on-device") is None and "postprocess" not in on_device.log
    assert hooks.final("late") is None
    assert [e.state for e in hooks.states if e.job_id == "late"] == [JobState.QUEUED]
