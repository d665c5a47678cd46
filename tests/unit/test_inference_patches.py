"""3D sliding window: matches a whole-volume run away from edges, keeps geometry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.factories.onnx_models import blur3d_model, model_spec

from radserve.domain.volume import Volume
from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
from radserve.inference.patches import filtered_gaussian, gaussian_weights, window_starts
from radserve.inference.tasks import activate
from radserve.preprocess import normalise

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


@pytest.fixture(scope="module")
def blur_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return blur3d_model(tmp_path_factory.mktemp("onnx") / "blur.onnx")


def _smooth_volume(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    from scipy import ndimage

    noise = np.random.default_rng(seed).normal(size=shape)
    field = ndimage.gaussian_filter(noise, 2.0)
    return (500 + 2000 * field).astype(np.int16)


def test_window_grid_and_weights() -> None:
    assert window_starts(20, 8, 0.5) == [0, 4, 8, 12]
    assert window_starts(21, 8, 0.5) == [0, 3, 6, 10, 13]
    assert window_starts(5, 8, 0.5) == [0]
    g = gaussian_weights((8, 8, 8))
    assert g.max() == pytest.approx(1.0) and g.min() > 0


def test_sliding_window_reproduces_whole_volume_run(blur_path: Path) -> None:
    spec = model_spec(mode="3d", spacing=(1.0, 1.0, 1.0), patch_size=(8, 8, 8), batch_size=4)
    session = ModelSession(blur_path, spec, runtime=CPU)
    vol = Volume.from_geometry(_smooth_volume((14, 19, 22)), spacing=(1.0, 1.0, 1.0))

    task = PatchTask(vol, spec, crop_to_body=False)
    pred = run_task(task, session)

    x = normalise(vol.array, spec.input.normalisation)[None, None]
    probs = activate(session.run(x), "softmax")[0]
    assert pred.labels.same_geometry(vol) and pred.confidence is not None
    inner = (slice(1, -1),) * 3
    want = np.argmax(probs, axis=0)[inner]
    sure = np.abs(probs[1] - 0.5)[inner] > 0.02  # ties may go either way
    assert 0.1 < want.mean() < 0.9
    np.testing.assert_array_equal(pred.labels.array[inner][sure], want[sure])
    conf = np.rint(probs.max(axis=0) * 255)[inner]
    assert np.abs(pred.confidence.array[inner].astype(int) - conf).max() <= 2


def test_resampled_3d_output_lands_on_the_native_grid(blur_path: Path) -> None:
    spec = model_spec(mode="3d", spacing=(2.0, 1.6, 1.6), patch_size=(8, 8, 8))
    session = ModelSession(blur_path, spec, runtime=CPU)
    hu = np.full((20, 30, 26), -1000, np.int16)
    hu[5:15, 8:22, 6:20] = 1000  # a dense box inside air
    vol = Volume.from_geometry(hu, spacing=(1.0, 0.8, 0.8), origin=(3.0, -7.0, 11.0))
    pred = run_task(PatchTask(vol, spec), session)
    assert pred.labels.same_geometry(vol)
    truth = hu > 0
    # The 3x3x3 mean rounds the box's edges off at model spacing; faces stay put.
    got_fg = pred.labels.array.astype(bool)
    assert got_fg[7:13, 10:20, 8:18].all()
    outside = np.ones_like(truth)
    outside[4:16, 7:23, 5:21] = False
    assert not got_fg[outside].any()
    # The box's centroid is where it was, within a voxel.
    got = np.argwhere(pred.labels.array).mean(axis=0)
    np.testing.assert_allclose(got, np.argwhere(truth).mean(axis=0), atol=1.0)


def test_nnunet_importance_map_is_computed_once_per_patch_size() -> None:
    """A 128^3 filtered Gaussian is seconds of SciPy: every task of a model shares one
    read-only copy (equal to a fresh one), as nnU-Net caches its own."""
    spec = model_spec(
        mode="3d",
        spacing=(2.0, 1.0, 1.0),
        patch_size=(8, 16, 16),
        sliding_window={"importance": "gaussian_filter"},
    )
    vol = Volume.from_geometry(_smooth_volume((10, 20, 20)), spacing=(2.0, 1.0, 1.0))
    first = PatchTask(vol, spec, crop_to_body=False)._weights
    again = PatchTask(vol, spec, crop_to_body=False)._weights
    assert first is again and not first.flags.writeable
    np.testing.assert_array_equal(first, filtered_gaussian((8, 16, 16), 1 / 8))
