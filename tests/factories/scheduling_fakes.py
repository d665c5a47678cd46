"""Stand-ins for tasks, sessions and jobs (test-only, outside the package): scheduler tests
run in microseconds, with a fake clock and no model files.

A :class:`FakeSession` can advance a :class:`~radserve.scheduling.clock.FakeClock` by a
fixed time per call and fail on chosen calls; a :class:`FakeTask` hands out numbered
batches of a chosen per-item shape and checks what comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from radserve.inference.tasks import Batch, Task
from radserve.scheduling.clock import FakeClock
from radserve.scheduling.jobs import BatchEvent, DeadlineMiss, JobEvent
from radserve.scheduling.work import CpuStage, DeviceStage, ModelKey, Stage


class FakeTask:
    """``n_batches`` batches of ``items`` samples of ``item_shape``; sample values are
    ``base`` + batch index, so a merged output can be checked against its batch."""

    def __init__(
        self,
        n_batches: int,
        *,
        items: int = 2,
        item_shape: tuple[int, ...] = (1, 4, 4),
        base: float = 0.0,
        prepare_errors: Sequence[Exception] = (),
    ) -> None:
        self.spec = None
        self.base = base
        self.input_shape = tuple(item_shape)
        self.items = items
        self._total = n_batches
        self._produced = 0
        self._prepare_errors = list(prepare_errors)
        self.accepted: list[int] = []
        self.timings: dict[str, float] = {}

    @property
    def total_batches(self) -> int:
        return self._total

    @property
    def done(self) -> bool:
        return len(self.accepted) >= self._total

    def next_batch(self) -> Batch | None:
        if self._prepare_errors:
            raise self._prepare_errors.pop(0)
        if self._produced >= self._total:
            return None
        index = self._produced
        self._produced += 1
        inputs = np.full((self.items, *self.input_shape), self.base + index, np.float32)
        first = index * self.items
        items = tuple(range(first, first + self.items))
        return Batch(task=self, index=index, items=items, inputs=inputs)  # type: ignore[arg-type]

    def accept(self, batch: Batch, output: np.ndarray) -> None:
        if batch.task is not cast(Task, self) or output.shape[0] != len(batch.items):
            raise AssertionError("output handed to the wrong task or of the wrong length")
        if not np.all(output == 2.0 * (self.base + batch.index)):
            raise AssertionError(f"batch {batch.index} got another batch's output")
        self.accepted.append(batch.index)

    def add_timing(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def finish(self, *, precision: str | None = None) -> object:
        return list(self.accepted)


class FakeSession:
    """Doubles its input; advances ``clock`` by ``seconds_per_call`` per call; raises the
    queued ``errors`` (one per call) first."""

    def __init__(
        self,
        clock: FakeClock | None = None,
        *,
        seconds_per_call: float = 0.0,
        precision: str = "fp32",
    ) -> None:
        self.clock = clock
        self.seconds_per_call = seconds_per_call
        self.precision = precision
        self.errors: list[Exception] = []
        self.calls: list[int] = []  # batch size of each call

    def run(self, batch: np.ndarray) -> np.ndarray:
        self.calls.append(len(batch))
        if self.clock is not None and self.seconds_per_call:
            self.clock.advance(self.seconds_per_call)
        if self.errors:
            raise self.errors.pop(0)
        return batch * 2.0


@dataclass
class FakeStep:
    model: ModelKey
    task: FakeTask
    session: FakeSession


@dataclass
class FakeWork:
    """ingest (CPU) -> each step (device) -> report (CPU); records the stages it ran."""

    steps: list[FakeStep]
    clock: FakeClock | None = None
    cpu_seconds: float = 0.0
    cpu_errors: list[Exception] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    _plan: list[Stage] | None = None

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.model.name for s in self.steps))

    def _cpu(self, name: str) -> CpuStage:
        def run() -> None:
            if self.clock is not None and self.cpu_seconds:
                self.clock.advance(self.cpu_seconds)
            if self.cpu_errors:
                raise self.cpu_errors.pop(0)
            self.log.append(name)

        return CpuStage(name, run)

    def next_stage(self) -> Stage | None:
        if self._plan is None:
            device: list[Stage] = [
                DeviceStage(s.model.name, s.model, cast(Task, s.task), s.session)
                for s in self.steps
            ]
            self._plan = [self._cpu("ingest"), *device, self._cpu("report")]
        return self._plan.pop(0) if self._plan else None

    def result(self) -> object:
        return list(self.log)


def fake_work(
    session: FakeSession,
    n_batches: int,
    *,
    model: ModelKey | None = None,
    items: int = 2,
    item_shape: tuple[int, ...] = (1, 4, 4),
    base: float = 0.0,
    clock: FakeClock | None = None,
    cpu_seconds: float = 0.0,
) -> FakeWork:
    """One-model work: the common case in tests."""
    step = FakeStep(
        model or ModelKey("organs", "1.0.0"),
        FakeTask(n_batches, items=items, item_shape=item_shape, base=base),
        session,
    )
    return FakeWork([step], clock=clock, cpu_seconds=cpu_seconds)


class RecordingHooks:
    """:class:`~radserve.scheduling.jobs.JobHooks` that keep every event, in order."""

    def __init__(self) -> None:
        self.states: list[JobEvent] = []
        self.misses: list[DeadlineMiss] = []
        self.batches: list[BatchEvent] = []

    def on_state(self, event: JobEvent) -> None:
        self.states.append(event)

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        self.misses.append(miss)

    def on_batch(self, event: BatchEvent) -> None:
        self.batches.append(event)

    def final(self, job_id: str) -> JobEvent | None:
        """The job's terminal event, if it has one."""
        ends = [e for e in self.states if e.job_id == job_id and e.state.terminal]
        return ends[-1] if ends else None


__all__ = ["FakeSession", "FakeStep", "FakeTask", "FakeWork", "RecordingHooks", "fake_work"]
