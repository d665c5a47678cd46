"""What a job asks of the scheduler: CPU stages and device steps, one after another.

A job's :class:`JobWork` hands out its stages in order. A :class:`CpuStage` runs on the
CPU pool (ingest, post-processing, report writing). A :class:`DeviceStage` is one model
over one study as a batch-level :class:`~radserve.inference.tasks.Task`: the scheduler
prepares its batches on the CPU pool, runs them on a device (mixed with other jobs'
batches when compatible) and merges the outputs back on the CPU pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from radserve.inference.runner import Runs
from radserve.inference.tasks import Task


@dataclass(frozen=True)
class ModelKey:
    """One servable model: batches mix only within one key (and one session)."""

    name: str
    version: str
    precision: str = "fp32"

    def __str__(self) -> str:
        return f"{self.name}@{self.version}/{self.precision}"


@dataclass(frozen=True, eq=False)
class CpuStage:
    """``run`` does the stage's work on a CPU-pool thread; it may raise."""

    name: str
    run: Callable[[], None]


@dataclass(frozen=True, eq=False)
class DeviceStage:
    """One model over one study: ``task``'s batches go through ``session`` on a device."""

    name: str
    model: ModelKey
    task: Task
    session: Runs


Stage = CpuStage | DeviceStage


class JobWork(Protocol):
    """One job's stages, handed out one at a time.

    ``next_stage`` is called (under the scheduler's lock) once the previous stage has
    finished: it must be cheap and do no I/O; heavy work belongs in ``CpuStage.run``.
    ``models`` names every model the job will run, so a job needing a model whose
    circuit breaker is open fails at once. ``result`` is called once, after the last
    stage; it is handed to the hooks with the ``succeeded`` state.
    """

    @property
    def models(self) -> tuple[str, ...]: ...

    def next_stage(self) -> Stage | None: ...

    def result(self) -> object: ...


def item_shape(task: Task) -> tuple[int, ...] | None:
    """Per-item input shape (C, H, W) or (C, D, H, W) a task's batches will have, if known
    before preparing one (used to wait for a compatible batch being prepared)."""
    shape = getattr(task, "input_shape", None)
    if shape is not None:
        return tuple(int(s) for s in shape)
    patch = getattr(task, "patch", None)
    if patch is not None:
        return (int(task.spec.input.in_channels), *(int(p) for p in patch))
    return None


__all__ = ["CpuStage", "DeviceStage", "JobWork", "ModelKey", "Stage", "item_shape"]
