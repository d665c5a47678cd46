"""A JPEG 2000 stack handed out while its decoder processes still fill it.

``load_series(decode_first=...)`` returns at once with a :class:`SliceArrival`; the
slices named first are decoded first, readers wait for what they read, and the volume
ends up equal to a whole decode. Stacks that cannot be filled in place (duplicates to
compare, values that may not fit int16, threads-only syntaxes) load whole as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import JPEG2000Lossless
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series, make_enhanced_series, ramp_hu, truncate

from radserve.checkpoints import yielding_to
from radserve.errors import DecodeError, StudyError
from radserve.inference.tasks import InferenceCancelledError
from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.ingest.arrival import DecodeAbandonedError, SliceArrival
from radserve.ingest.decode import (
    _FRAMES_PER_TASK,
    _ordered_tasks,
    shutdown_decode_workers,
    start_decode_stack,
)
from radserve.ingest.geometry import plan_stack
from radserve.ingest.headers import FrameRef
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study

N = 12


@pytest.fixture(scope="module", autouse=True)
def _stop_workers() -> Iterator[None]:
    yield
    shutdown_decode_workers()


def _series(folder: Path, **kwargs: object) -> list[Path]:
    try:
        return make_ct_series(
            folder, n_slices=N, rows=40, cols=36, transfer_syntax=JPEG2000Lossless, **kwargs
        )
    except RuntimeError as exc:  # no JPEG 2000 encoder installed here
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")


def _ordered(folder: Path) -> list[FrameRef]:
    header = discover_series(folder)[0]
    return [header.frames[i] for i in plan_stack(header.frames, IngestPolicy()).order]


def every_third(shape: tuple[int, int, int], spacing: tuple[float, float, float]) -> range:
    return range(0, shape[0], 3)


def test_the_first_slices_are_handed_to_the_workers_first() -> None:
    frames = [object()] * 10
    tasks = [[k for k, _ in task] for task in _ordered_tasks(frames, [0, 3, 6, 9])]  # type: ignore[arg-type]
    assert tasks[0] == [0, 3, 6, 9]  # one task of the first slices, before any other
    assert [k for task in tasks[1:] for k in task] == [1, 2, 4, 5, 7, 8]
    assert all(len(task) <= _FRAMES_PER_TASK for task in tasks)


def test_a_streamed_stack_equals_the_whole_decode(tmp_path: Path) -> None:
    hu = ramp_hu(N, 40, 36)
    _series(tmp_path, hu=hu, order="shuffled")
    loaded = load_series(discover_series(tmp_path)[0], workers=2, decode_first=every_third)
    assert loaded.arrival is not None
    loaded.arrival.wait(range(0, N, 3))  # the slices asked for first
    np.testing.assert_array_equal(loaded.volume.array[::3], hu[::3])
    loaded.wait_decoded()
    assert loaded.arrival.complete
    np.testing.assert_array_equal(loaded.volume.array, hu)
    assert loaded.volume.array.dtype == np.int16
    whole = load_series(discover_series(tmp_path)[0], workers=2)
    assert whole.arrival is None
    assert whole.source_slices == loaded.source_slices
    np.testing.assert_array_equal(whole.volume.affine, loaded.volume.affine)


def test_a_streamed_multiframe_stack_in_shuffled_frame_order(tmp_path: Path) -> None:
    hu = ramp_hu(N, 40, 36)
    try:
        make_enhanced_series(
            tmp_path, n_frames=N, rows=40, cols=36, hu=hu, frame_order="shuffled",
            transfer_syntax=JPEG2000Lossless,
        )  # fmt: skip
    except RuntimeError as exc:
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")
    loaded = load_series(discover_series(tmp_path)[0], workers=2, decode_first=every_third)
    assert loaded.arrival is not None
    loaded.wait_decoded()
    np.testing.assert_array_equal(loaded.volume.array, hu)


def test_a_damaged_frame_reaches_every_reader_by_its_instance(tmp_path: Path) -> None:
    paths = _series(tmp_path)
    frames = _ordered(tmp_path)
    bad = sorted(paths)[7]
    truncate(bad, keep_fraction=0.7)
    started = start_decode_stack(frames, air=-1000.0, first=[0, 3], workers=2)
    assert started is not None
    _, arrival = started
    for _ in range(2):  # the error stays: a later reader raises it too
        with pytest.raises(
            DecodeError,
            match=r"instance 8 \(SOP Instance UID [0-9.]+\): the pixel data \(JPEG 2000",
        ):
            arrival.wait_all()


def test_stacks_that_cannot_fill_in_place_load_whole(tmp_path: Path) -> None:
    # rescaled values that may pass int16: the whole stack may need float32
    _series(tmp_path / "wide", hu=np.full((N, 40, 36), 30100.0), rescale=(1.0, 30000.0))
    assert start_decode_stack(_ordered(tmp_path / "wide"), air=-1000.0, workers=2) is None
    # uncompressed: threads, not processes
    make_ct_series(tmp_path / "raw", n_slices=N, rows=40, cols=36)
    assert start_decode_stack(_ordered(tmp_path / "raw"), air=-1000.0, workers=1) is None
    # duplicate positions are compared once decoded: the policy's check runs as before
    hu = ramp_hu(N, 40, 36)
    _series(tmp_path / "dup", hu=hu, duplicate=[4])
    loaded = load_series(discover_series(tmp_path / "dup")[0], decode_first=every_third)
    assert loaded.arrival is None
    assert any("duplicate" in w for w in loaded.warnings)


def test_a_waiting_reader_wakes_when_its_slices_land_or_the_decode_fails() -> None:
    arrival = SliceArrival(4)
    woke = threading.Event()

    def reader() -> None:
        arrival.wait([1, 2])
        woke.set()

    thread = threading.Thread(target=reader)
    thread.start()
    arrival.mark([1])
    assert not woke.is_set()  # slice 2 is still missing
    arrival.mark([2])
    thread.join(timeout=30)
    assert woke.is_set() and not arrival.complete
    failed = SliceArrival(2)
    failed.mark([0])
    failed.fail(DecodeError("frame 2 is damaged"))
    for wait in (lambda: failed.wait([1]), lambda: failed.wait([0]), failed.wait_all):
        with pytest.raises(DecodeError, match="frame 2 is damaged"):  # even slices in place
            wait()


def test_values_past_bits_stored_fall_back_to_a_whole_float32_decode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bits Stored promises values that fit int16, the pixels break it: the streamed
    run stops at the first such slice and the study is decoded whole, as float32. In a
    CT such values (past 32,767 HU) are beyond any CT scale: the whole decode refuses
    them (since 2026-12-03; they ran, see tests/unit/test_ingest_series.py -k
    implausible)."""
    hu = np.full((N, 40, 36), 30100.0)
    hu[:, :, :6] = 34000.0  # stored 4000: 12 bits, but past int16 once rescaled
    paths = _series(tmp_path / "study", hu=hu, rescale=(1.0, 30000.0))
    for path in paths:  # the header now says 11 bits (at most 32047 once rescaled)
        ds = pydicom.dcmread(path)
        ds.BitsStored, ds.HighBit = 11, 10
        ds.save_as(path)
    caplog.set_level("INFO", logger="radserve.pipeline.study")
    registry = ModelRegistry(write_test_bundles(tmp_path / "models"))
    pipeline = load_pipeline(write_test_pipeline(tmp_path))
    assert start_decode_stack(_ordered(tmp_path / "study"), air=-1000.0, workers=2) is not None
    with pytest.raises(StudyError, match=r"CT values reach 34000 HU") as refused:
        run_study(
            tmp_path / "study", pipeline=pipeline, out_dir=tmp_path / "out", registry=registry,
            key_images=False, stream_decode=True,
        )  # fmt: skip
    assert "decoding the study whole, as float32" in caplog.text
    assert refused.value.code == "implausible_pixel_values"


class _HeldDecoder:
    """A checkpoint waiter that holds the ``decode-stack`` thread at its checkpoint
    before handing the processes task ``hold_at`` (the tasks before it fill the pool),
    until :meth:`release`; it counts the tasks the thread came to hand out."""

    def __init__(self, hold_at: int, hold_s: float = 60.0) -> None:
        self.hold_at = hold_at
        self.hold_s = hold_s
        self.calls = 0
        self.held = threading.Event()
        self.gate = threading.Event()

    def __call__(self) -> None:
        if threading.current_thread().name != "decode-stack":
            return
        self.calls += 1
        if self.calls >= self.hold_at:
            self.held.set()
            self.gate.wait(self.hold_s)

    def release(self) -> None:
        self.gate.set()


def _decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "decode-stack"]


MANY = 96  # 24 tasks of 4 frames; 2 workers x 2 tasks ahead fill the pool with 4
# checkpoints the decode thread can pass once abandoned: one per task that had finished
# alongside the one it was held at, each then handing out nothing
AFTER = 2 * 2 - 1


def test_an_abandoned_stack_hands_its_processes_no_more_work(tmp_path: Path) -> None:
    """The reader's run ended (cancelled, failed): the decoder gives the processes
    nothing more of the stack, drops what is in flight, and readers get the reason."""
    try:
        make_ct_series(tmp_path, n_slices=MANY, rows=40, cols=36, transfer_syntax=JPEG2000Lossless)
    except RuntimeError as exc:
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")
    held = _HeldDecoder(hold_at=5)
    with yielding_to(held):
        started = start_decode_stack(_ordered(tmp_path), air=-1000.0, workers=2)
    assert started is not None
    _, arrival = started
    # the pool was filled, a task landed, the next one waits at its checkpoint
    assert held.held.wait(60)
    arrival.abandon()
    held.release()
    assert arrival.wait_stopped(60)
    assert held.calls <= 5 + AFTER  # no task after the abandonment (24 without it)
    landed = int(np.count_nonzero(arrival._done))
    assert 0 < landed <= (5 + AFTER) * _FRAMES_PER_TASK < MANY
    with pytest.raises(DecodeAbandonedError, match="abandoned"):
        arrival.wait_all()
    assert not arrival.complete


def test_a_cancelled_streamed_run_stops_its_decoder(tmp_path: Path) -> None:
    """``run_study(cancel=...)`` on a JPEG 2000 study: the cancelled run raises, and its
    stack's decoder stops handing out work instead of decoding the study to its end."""
    try:
        make_ct_series(
            tmp_path / "study", n_slices=MANY, rows=40, cols=36,
            transfer_syntax=JPEG2000Lossless,
        )  # fmt: skip
    except RuntimeError as exc:
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")
    registry = ModelRegistry(write_test_bundles(tmp_path / "models"))
    pipeline = load_pipeline(write_test_pipeline(tmp_path))
    cancel = threading.Event()
    cancel.set()  # e.g. DELETE /v1/jobs/{id} (or a server stopping) as it starts
    # held until the run ended, or 5 s if the run waits for slices past the held task
    held = _HeldDecoder(hold_at=5, hold_s=5.0)
    with yielding_to(held), pytest.raises((InferenceCancelledError, DecodeAbandonedError)):
        run_study(
            tmp_path / "study", pipeline=pipeline, out_dir=tmp_path / "out",
            registry=registry, key_images=False, stream_decode=True, cancel=cancel,
        )  # fmt: skip
    held.release()
    for thread in _decode_threads():
        thread.join(60)
    assert held.calls <= 5 + AFTER  # 24 tasks when the decode ran on to its end
