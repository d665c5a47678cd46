"""2.5D context gathering: known answers, the classic rule unchanged, clamping, contract."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from tests.factories.onnx_models import model_spec, threshold_model

from radserve.domain.volume import Volume
from radserve.inference import ModelSession, SliceTask, choose_runtime, run_task
from radserve.preprocess import context_reach, context_step, gather_context, normalise

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def ramp(nz: int = 10, h: int = 3, w: int = 4) -> np.ndarray:
    """Slice z holds 10 * z everywhere (plus the column index, to check the crop)."""
    z, _y, x = np.mgrid[0:nz, 0:h, 0:w]
    return (10 * z + x).astype(np.int16)


def test_none_is_the_classic_integer_gather_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    array = rng.integers(-1000, 1000, (7, 5, 6)).astype(np.int16)
    items = [0, 1, 3, 6]
    ys, xs = slice(1, 4), slice(2, 6)
    z = np.clip(np.asarray(items)[:, None] + np.arange(-2, 3)[None, :], 0, 6)
    expected = array[z, ys, xs]
    out = gather_context(array, items, 2, None, (ys, xs))
    assert out.dtype == np.float32 and out.shape == (4, 5, 3, 4)
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    # float64 stays float64 (like interpolate_axis), so nothing is rounded on the way.
    f64 = rng.normal(size=(5, 2, 2))
    np.testing.assert_array_equal(gather_context(f64, [2], 1), f64[[[1, 2, 3]]])


def test_known_answer_on_a_ramp_with_fractional_step() -> None:
    array = ramp()
    # 2.5 mm context on 1 mm slices: neighbours at z - 5, z - 2.5, z, z + 2.5, z + 5.
    step = context_step(2.5, 1.0)
    assert step == 2.5 and context_reach(2, step) == 5
    out = gather_context(array, [5], 2, step, (slice(0, 1), slice(0, 1)))
    np.testing.assert_allclose(out[0, :, 0, 0], [0.0, 25.0, 50.0, 75.0, 90.0])
    # Interpolated on the raw values, crop respected (column 2 adds 2 everywhere).
    out = gather_context(array, [4], 1, 0.5, (slice(None), slice(2, 3)))
    np.testing.assert_allclose(out[0, :, :, 0], [[37.0] * 3, [42.0] * 3, [47.0] * 3])


def test_whole_steps_read_native_slices_exactly_and_clamp_at_both_ends() -> None:
    array = ramp()
    # 2.5 mm on 1.25 mm slices (with rounding noise in the spacing): step 2, exact slices.
    step = context_step(2.5, 1.2500000001)
    assert context_reach(2, step) == 4
    out = gather_context(array, [0, 1, 9], 2, step)
    np.testing.assert_array_equal(
        out[:, :, 0, 0], [[0, 0, 0, 20, 40], [0, 0, 10, 30, 50], [50, 70, 90, 90, 90]]
    )
    # A fractional step near the ends: clamped to the first/last slice, never beyond.
    out = gather_context(array, [0, 9], 1, 1.7)
    np.testing.assert_allclose(out[:, :, 0, 0], [[0.0, 0.0, 17.0], [73.0, 90.0, 90.0]])


def test_context_mm_is_validated_and_only_for_2_5d() -> None:
    spec = model_spec(mode="2.5d", context_slices=2, context_mm=2.5)
    assert spec.input.context_mm == 2.5 and spec.input.in_channels == 5
    assert model_spec(mode="2.5d", context_slices=1).input.context_mm is None
    with pytest.raises(ValidationError, match="greater than 0"):
        model_spec(mode="2.5d", context_slices=1, context_mm=0.0)
    with pytest.raises(ValidationError, match=r"mode '2\.5d'"):
        model_spec(mode="2d", context_mm=2.0)
    with pytest.raises(ValidationError, match="context_slices >= 1"):
        model_spec(mode="2.5d", context_mm=2.0)


def test_slice_task_feeds_the_model_neighbours_at_context_mm(tmp_path: Path) -> None:
    """Through the engine: a threshold model on the mean of 3 channels (> 2/3 bright
    needed) finds slice 4 between bright slices 2 and 6 only with ±2 mm context."""
    hu = np.zeros((9, 8, 8), np.int16)
    hu[[2, 6]] = 1000
    vol = Volume.from_geometry(hu, spacing=(1.0, 1.5, 1.5))
    path = threshold_model(tmp_path / "t25.onnx", in_channels=3)
    found = {}
    for context_mm in (None, 2.0):
        spec = model_spec(mode="2.5d", context_slices=1, context_mm=context_mm, divisible_by=8)
        session = ModelSession(path, spec, runtime=CPU)
        found[context_mm] = run_task(SliceTask(vol, spec), session).labels.array[:, 4, 4]
    assert found[None].tolist() == [0] * 9
    assert found[2.0].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0]


def test_gather_matches_the_engine_input_for_context_mm() -> None:
    """The training builder and the engine share gather_context: same numbers."""
    rng = np.random.default_rng(1)
    hu = rng.integers(-1000, 400, (12, 16, 16)).astype(np.int16)
    vol = Volume.from_geometry(hu, spacing=(0.8, 1.0, 1.0))
    spec = model_spec(mode="2.5d", context_slices=2, context_mm=2.0, spacing=(None, 1.0, 1.0))
    task = SliceTask(vol, spec, crop_to_body=False)
    batch = task.next_batch()
    assert batch is not None
    step = context_step(2.0, 0.8)
    expected = gather_context(hu, batch.items, 2, step)
    expected = normalise(expected, spec.input.normalisation)
    np.testing.assert_array_equal(batch.inputs[:, :, :16, :16], expected)
