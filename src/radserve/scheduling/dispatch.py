"""Units of work the scheduler hands out, and how any executor runs one.

The scheduler decides *what* runs next; an executor decides *where* (a thread of this
process, or later a Ray actor) and reports back with an :class:`DispatchOutcome`. Keeping
:func:`execute` here means every executor runs a unit the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from radserve.errors import ModelError
from radserve.inference.runner import Runs
from radserve.inference.tasks import Batch
from radserve.scheduling.work import CpuStage, DeviceStage, ModelKey


@dataclass(frozen=True, eq=False)
class StageDispatch:
    """Run a job's CPU stage (ingest, post-processing, report)."""

    job_id: str
    stage: CpuStage
    started: float


@dataclass(frozen=True, eq=False)
class PrepareDispatch:
    """Prepare the next batch of a job's device stage (crop, resample, normalise)."""

    job_id: str
    stage: DeviceStage
    started: float


@dataclass(frozen=True, eq=False)
class MergeDispatch:
    """Map one batch's output back onto the job's volume."""

    job_id: str
    stage: DeviceStage
    batch: Batch
    output: np.ndarray
    started: float


@dataclass(frozen=True, eq=False)
class BatchPart:
    job_id: str
    batch: Batch

    @property
    def items(self) -> int:
        return int(self.batch.inputs.shape[0])


@dataclass(frozen=True, eq=False)
class BatchDispatch:
    """One device call: the parts' inputs concatenated, one ``session.run``."""

    device: str
    model: ModelKey
    session: Runs
    parts: tuple[BatchPart, ...]
    started: float

    @property
    def items(self) -> int:
        return sum(p.items for p in self.parts)


CpuDispatch = StageDispatch | PrepareDispatch | MergeDispatch
Dispatch = CpuDispatch | BatchDispatch


@dataclass(frozen=True)
class DispatchOutcome:
    """What running a dispatch gave: ``value`` (a Batch or None for a prepare, the
    per-part outputs for a device batch) or the ``error`` it raised; ``paused_s``, the
    seconds a routine unit spent paused at checkpoints while URGENT work ran."""

    value: object = None
    error: Exception | None = None
    paused_s: float = 0.0


def run_batch(dispatch: BatchDispatch) -> list[np.ndarray]:
    """Concatenate the parts, run them in one call, split the output back per part."""
    inputs = [p.batch.inputs for p in dispatch.parts]
    x = inputs[0] if len(inputs) == 1 else np.concatenate(inputs)
    t0 = time.perf_counter()
    out = dispatch.session.run(x)
    seconds = time.perf_counter() - t0
    if len(out) != len(x):
        raise ModelError(
            f"model {dispatch.model} returned {len(out)} outputs for a batch of {len(x)} "
            "inputs; its output must keep the batch axis (N, classes, spatial...)"
        )
    parts, start = [], 0
    for part in dispatch.parts:
        stop = start + part.items
        parts.append(out[start:stop])
        part.batch.task.add_timing("infer", seconds * part.items / len(x))
        start = stop
    return parts


def execute(dispatch: Dispatch) -> DispatchOutcome:
    """Run one unit on the calling thread; exceptions become the outcome's error."""
    try:
        if isinstance(dispatch, BatchDispatch):
            return DispatchOutcome(value=run_batch(dispatch))
        if isinstance(dispatch, PrepareDispatch):
            return DispatchOutcome(value=dispatch.stage.task.next_batch())
        if isinstance(dispatch, MergeDispatch):
            dispatch.stage.task.accept(dispatch.batch, dispatch.output)
            return DispatchOutcome()
        dispatch.stage.run()
        return DispatchOutcome()
    except Exception as exc:  # reported to the scheduler, which retries or fails the job
        return DispatchOutcome(error=exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # pyo3's PanicException (a Rust decoder's) derives from BaseException: it passed
        # every ``except Exception``, ended the worker thread and left its job running
        # and every later job queued; so did a stage's sys.exit(). It is this unit's
        # failure, like any other.
        error = RuntimeError(f"the unit ended in {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return DispatchOutcome(error=error)


__all__ = [
    "BatchDispatch",
    "BatchPart",
    "CpuDispatch",
    "Dispatch",
    "DispatchOutcome",
    "MergeDispatch",
    "PrepareDispatch",
    "StageDispatch",
    "execute",
    "run_batch",
]
