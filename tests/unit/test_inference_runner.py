"""Runners: overlapped equals synchronous, cancellation stops at a batch boundary."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tests.factories.onnx_models import blur3d_model, model_spec, threshold_model

from radserve.domain.prediction import Prediction
from radserve.domain.volume import Volume
from radserve.errors import InferenceError
from radserve.inference import (
    InferenceCancelledError,
    ModelSession,
    PatchTask,
    SliceTask,
    choose_runtime,
    run_task,
    run_task_overlapped,
)

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


class Counting:
    """Wraps a session; counts calls and can fail or cancel on the n-th call."""

    def __init__(self, inner: ModelSession, *, fail_at: int = 0) -> None:
        self.inner, self.precision, self.calls, self.fail_at = inner, inner.precision, 0, fail_at

    def run(self, batch: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == self.fail_at:
            raise InferenceError("device lost")
        return self.inner.run(batch)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> ModelSession:
    path = threshold_model(tmp_path_factory.mktemp("onnx") / "t.onnx")
    return ModelSession(path, model_spec(batch_size=2, divisible_by=8, kind="lesion"), runtime=CPU)


def _volume(n: int = 9) -> Volume:
    hu = np.random.default_rng(3).integers(-1000, 1500, size=(n, 21, 26)).astype(np.int16)
    return Volume.from_geometry(hu, spacing=(2.0, 0.8, 1.1))


@pytest.mark.parametrize("runner", [run_task, run_task_overlapped])
def test_cancel_stops_at_a_batch_boundary(
    session: ModelSession, runner: Callable[..., Prediction]
) -> None:
    cancel = threading.Event()
    counted = Counting(session)
    seen: list[tuple[int, int]] = []
    calls_at_cancel: list[int] = []

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        calls_at_cancel.append(counted.calls)
        cancel.set()

    task = SliceTask(_volume(), session.spec, crop_to_body=False)
    assert task.total_batches == 5
    with pytest.raises(InferenceCancelledError, match="cancelled"):
        runner(task, counted, cancel=cancel, progress=progress)
    assert seen[0] == (1, 5)
    # A batch the device had started may finish; no new one starts after the flag.
    assert seen == [(1, 5)]
    assert counted.calls <= calls_at_cancel[0] + 1 and not task.done


def test_overlapped_equals_synchronous(session: ModelSession, tmp_path: Path) -> None:
    vol = _volume()
    a = run_task(SliceTask(vol, session.spec), session)
    seen: list[int] = []
    b = run_task_overlapped(
        SliceTask(vol, session.spec), session, progress=lambda d, t: seen.append(d)
    )
    np.testing.assert_array_equal(a.labels.array, b.labels.array)
    assert a.confidence is not None and b.confidence is not None
    np.testing.assert_array_equal(a.confidence.array, b.confidence.array)
    assert seen == list(range(1, b.batches + 1))

    spec3 = model_spec(mode="3d", spacing=(2.0, 1.0, 1.0), patch_size=(4, 8, 8), batch_size=3)
    s3 = ModelSession(blur3d_model(tmp_path / "b.onnx"), spec3, runtime=CPU)
    p = run_task(PatchTask(vol, spec3), s3)
    q = run_task_overlapped(PatchTask(vol, spec3), s3)
    assert p.batches > 2
    np.testing.assert_array_equal(p.labels.array, q.labels.array)


def test_a_failing_batch_surfaces_and_stops_the_workers(session: ModelSession) -> None:
    before = threading.active_count()
    with pytest.raises(InferenceError, match="device lost"):
        run_task_overlapped(SliceTask(_volume(), session.spec), Counting(session, fail_at=2))
    assert threading.active_count() == before


class Releasing(Counting):
    """Also records when the runner asks the session to release its arena."""

    def __init__(self, inner: ModelSession) -> None:
        super().__init__(inner)
        self.released_after: list[int] = []

    def release_memory(self) -> None:
        self.released_after.append(self.calls)


@pytest.mark.parametrize("runner", [run_task, run_task_overlapped])
def test_the_arena_is_released_once_after_the_last_batch(
    session: ModelSession, runner: Callable[..., Prediction]
) -> None:
    releasing = Releasing(session)
    task = SliceTask(_volume(), session.spec)
    runner(task, releasing)
    assert releasing.calls == task.total_batches > 1
    assert releasing.released_after == [task.total_batches]
