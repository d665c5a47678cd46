"""2D / 2.5D engine: native geometry in, native geometry out, same as numpy by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.factories.onnx_models import (
    conv_model,
    model_spec,
    threshold_logits,
    threshold_model,
)

from radserve.domain.volume import Volume
from radserve.errors import ModelError, PipelineError
from radserve.inference import ModelSession, SliceTask, choose_runtime, run_task
from radserve.inference.tasks import activate, decide
from radserve.preprocess import (
    bbox_of_mask,
    context_step,
    gather_context,
    grid_offset,
    normalise,
    resample_inplane,
)

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def phantom(shape: tuple[int, int, int] = (3, 37, 53)) -> Volume:
    """Air around an elliptical body (200 HU) holding a smooth dense blob (up to 1000)."""
    z, y, x = np.mgrid[0 : shape[0], 0 : shape[1], 0 : shape[2]].astype(np.float32)
    cy, cx = shape[1] / 2, shape[2] / 2
    body = ((y - cy) / (0.4 * shape[1])) ** 2 + ((x - cx) / (0.4 * shape[2])) ** 2 <= 1
    blob = 800 * np.exp(-(((y - cy - 3) / 6) ** 2 + ((x - cx + 5) / 9) ** 2 + ((z - 1) / 3) ** 2))
    hu = np.where(body, 200 + blob, -1000).astype(np.int16)
    return Volume.from_geometry(hu, spacing=(2.5, 0.7, 0.9), origin=(10.0, -20.0, 5.0))


@pytest.fixture(scope="module")
def session_2d(tmp_path_factory: pytest.TempPathFactory) -> ModelSession:
    path = threshold_model(tmp_path_factory.mktemp("onnx") / "t2d.onnx")
    return ModelSession(path, model_spec(divisible_by=16, batch_size=2, kind="lesion"), runtime=CPU)


def test_engine_equals_numpy_and_keeps_geometry(session_2d: ModelSession) -> None:
    vol = phantom()
    spec = session_2d.spec
    task = SliceTask(vol, spec)
    assert task.input_shape[1] % 16 == 0 and task.input_shape[2] % 16 == 0
    pred = run_task(task, session_2d)

    assert pred.labels.shape == vol.shape and pred.confidence is not None
    assert pred.labels.array.dtype == np.uint8 and pred.confidence.array.dtype == np.uint8
    np.testing.assert_array_equal(pred.labels.affine, vol.affine)
    assert pred.batches == 2 and {"prepare", "infer", "merge", "wall"} <= set(pred.timings)

    # The same computation by hand, on the crop the task chose.
    zs, ys, xs = task.box
    crop = Volume.from_geometry(vol.array[:, ys, xs], spacing=vol.spacing)
    small = resample_inplane(crop, (1.5, 1.5), order=1)
    x = normalise(small.array, spec.input.normalisation)[:, None]
    probs = activate(threshold_logits(x), "softmax")
    back = resample_inplane(Volume(probs[:, 1], small.affine), crop.spacing[1:], order=1).array
    probs_native = np.stack([1 - back, back])
    want_labels, want_conf = decide(probs_native, spec, axis=0)
    expected = np.zeros(vol.shape, np.uint8)
    expected[zs, ys, xs] = want_labels
    np.testing.assert_array_equal(pred.labels.array, expected)
    got_conf = pred.confidence.array[zs, ys, xs].astype(int)
    assert np.abs(got_conf - want_conf).max() <= 1
    assert (pred.confidence.array[expected == 0] > 0).all()

    # And it agrees with thresholding the native image, up to resampling at the edges.
    truth = vol.array > 500
    assert truth.sum() > 100
    assert (pred.labels.array.astype(bool) == truth).mean() > 0.97


def test_roi_outputs_are_roi_sized_and_land_on_the_roi(session_2d: ModelSession) -> None:
    vol = phantom()
    roi = (slice(1, 3), slice(12, 26), slice(20, 40))
    pred = run_task(SliceTask(vol, session_2d.spec, roi=roi), session_2d)
    assert pred.confidence is not None
    # Only the ROI is held, and its geometry says where it lies in the volume.
    assert pred.labels.shape == pred.confidence.shape == (2, 14, 20)
    assert grid_offset(pred.labels, vol) == (1, 12, 20)
    np.testing.assert_allclose(
        pred.labels.index_to_patient([0, 0, 0]), vol.index_to_patient([1, 12, 20])
    )
    assert pred.labels.source_sop_instance_uids == vol.source_sop_instance_uids[1:3]
    assert pred.labels.array.any()
    # The same voxels as a whole-volume run on the same crop (roi = body box).
    body = SliceTask(vol, session_2d.spec)
    whole = run_task(SliceTask(vol, session_2d.spec, roi=body.box), session_2d)
    full = run_task(body, session_2d)
    assert full.labels.shape == vol.shape
    np.testing.assert_array_equal(whole.labels.array, full.labels.array[body.box])
    assert whole.confidence is not None and full.confidence is not None
    np.testing.assert_array_equal(whole.confidence.array, full.confidence.array[body.box])


def test_empty_roi_gives_empty_prediction(session_2d: ModelSession) -> None:
    vol = phantom()
    task = SliceTask(vol, session_2d.spec, roi=(slice(0, 0), slice(0, 37), slice(0, 53)))
    assert task.total_batches == 0
    pred = run_task(task, session_2d)
    assert pred.labels.shape == (0, 37, 53) and not pred.labels.array.any()


def test_25d_neighbours_are_clamped_at_volume_ends(tmp_path: Path) -> None:
    spec = model_spec(mode="2.5d", context_slices=1, divisible_by=8)
    session = ModelSession(threshold_model(tmp_path / "t25.onnx", in_channels=3), spec, runtime=CPU)
    hu = np.zeros((4, 9, 11), np.int16)
    hu[[0, 3]] = 1000
    vol = Volume.from_geometry(hu, spacing=(3.0, 1.5, 1.5))
    pred = run_task(SliceTask(vol, spec), session)
    # Slice 0 sees (1000, 1000, 0) -> mean 2/3 > 0.5; slice 1 sees (1000, 0, 0).
    assert [bool(pred.labels.array[i].all()) for i in range(4)] == [True, False, False, True]
    assert not pred.labels.array[1:3].any()


@pytest.mark.parametrize("context_mm", [None, 2.5])
def test_batches_reuse_resampled_slices_and_match_the_training_inputs(context_mm) -> None:
    """Each batch's input equals the training-time construction (gather the context in
    HU, then resample, normalise), whatever the previous batch left to reuse."""
    spec = model_spec(mode="2.5d", context_slices=2, context_mm=context_mm, divisible_by=16)
    vol = phantom((11, 37, 53))
    vol = Volume.from_geometry(vol.array, spacing=(1.0, 0.7, 0.9))
    task = SliceTask(vol, spec, max_batch_size=2)
    zs, ys, xs = task.box
    step = context_step(context_mm, vol.spacing[0])
    n = 0
    while (batch := task.next_batch()) is not None:
        image = gather_context(vol.array, batch.items, 2, step, (ys, xs))
        crop = Volume.from_geometry(image.reshape(-1, *image.shape[2:]), spacing=vol.spacing)
        small = resample_inplane(crop, (1.5, 1.5), order=1).array
        want = normalise(small, spec.input.normalisation)
        want = want.reshape(len(batch.items), 5, *want.shape[1:])
        py = slice(task._pad_y, task._pad_y + want.shape[2])
        px = slice(task._pad_x, task._pad_x + want.shape[3])
        np.testing.assert_allclose(batch.inputs[:, :, py, px], want, rtol=0, atol=1e-5)
        if context_mm is None:  # whole-slice neighbours: bit for bit
            np.testing.assert_array_equal(batch.inputs[:, :, py, px], want)
        n += len(batch.items)
    assert n == zs.stop - zs.start


def test_extra_channels_follow_the_image(tmp_path: Path) -> None:
    spec = model_spec(extra_channels=("liver",), divisible_by=8)
    session = ModelSession(threshold_model(tmp_path / "x.onnx", in_channels=2), spec, runtime=CPU)
    vol = Volume.from_geometry(np.full((2, 12, 15), 600, np.int16), spacing=(2.0, 1.5, 1.5))
    mask = np.zeros(vol.shape, bool)
    mask[:, 3:8, 4:10] = True
    pred = run_task(SliceTask(vol, spec, extra_channels={"liver": mask}), session)
    np.testing.assert_array_equal(pred.labels.array, mask.astype(np.uint8))
    with pytest.raises(PipelineError, match="needs upstream label masks \\['liver'\\]"):
        SliceTask(vol, spec)


def test_through_plane_spacing_is_refused_for_slice_models() -> None:
    with pytest.raises(ModelError, match="run on native slices"):
        SliceTask(phantom(), model_spec(spacing=(3.0, 1.5, 1.5)))


def test_sigmoid_threshold_and_memory_budget(tmp_path: Path) -> None:
    spec = model_spec(activation="sigmoid", batch_size=8, divisible_by=8)
    w = np.full((1, 1, 1, 1), 20.0, np.float32)

    session = ModelSession(conv_model(tmp_path / "s.onnx", w, np.array([-10.0])), spec, runtime=CPU)
    vol = phantom((5, 37, 53))
    task = SliceTask(vol, spec, memory_budget_bytes=3 * SliceTask(vol, spec).bytes_per_slice())
    assert task.batch_size == 3
    assert SliceTask(vol, spec, max_batch_size=2).batch_size == 2  # the device's cap
    assert SliceTask(vol, spec, max_batch_size=16).batch_size == 8  # model.yaml's
    pred = run_task(task, session)
    assert (pred.labels.array.astype(bool) == (vol.array > 500)).mean() > 0.97
    assert set(np.unique(pred.labels.array)) == {0, 1}


def test_organ_models_keep_no_confidence_map(tmp_path: Path) -> None:
    spec = model_spec(divisible_by=16, batch_size=2)  # organ labels
    session = ModelSession(threshold_model(tmp_path / "t.onnx"), spec, runtime=CPU)
    pred = run_task(SliceTask(phantom(), spec), session)
    assert pred.confidence is None and pred.labels.array.any()
    # The extent handed to post-processing is the tight box of what was written.
    assert pred.extent == bbox_of_mask(pred.labels.array != 0)
