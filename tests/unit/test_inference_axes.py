"""``input.axes``: a 3D network in another axis order sees the volume its own way round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.factories.onnx_models import conv_model, model_spec

from radserve.domain.volume import Volume
from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
from radserve.preprocess.axes import axis_map

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _volume(shape: tuple[int, int, int], seed: int) -> np.ndarray:
    from scipy import ndimage

    field = ndimage.gaussian_filter(np.random.default_rng(seed).normal(size=shape), 1.5)
    return (500 + 3000 * field).astype(np.int16)


def _run(tmp: Path, name: str, kernel: np.ndarray, vol: Volume, **fields: object) -> np.ndarray:
    path = conv_model(tmp / f"{name}.onnx", kernel, np.array([0.0, 0.1], np.float32))
    spec = model_spec(mode="3d", spacing=(1.0, 1.0, 1.0), patch_size=(8, 8, 8), **fields)
    return run_task(PatchTask(vol, spec, crop_to_body=False), ModelSession(path, spec, runtime=CPU))


@pytest.mark.parametrize(
    ("axes", "to_default"),
    [
        # network axes (x, y, z): the same kernel seen from (z, y, x) is transposed
        (["x", "y", "z"], lambda w: w.transpose(0, 1, 4, 3, 2)),
        (["y", "x", "z"], lambda w: w.transpose(0, 1, 4, 2, 3)),
        # RAS on a standard axial stack (columns -> L, rows -> P, slices -> S):
        # network axis 0 is the reversed column axis, 1 the reversed row axis.
        (["R", "A", "S"], lambda w: np.flip(w, axis=(2, 3)).transpose(0, 1, 4, 3, 2)),
        (["S", "P", "L"], lambda w: w),
        (["I", "A", "L"], lambda w: np.flip(w, axis=(2, 3))),
    ],
)
def test_declared_axes_equal_the_transposed_network(
    tmp_path: Path, axes: list[str], to_default: object
) -> None:
    """A random (direction-sensitive) 3x3x3 network declared in another axis order gives
    the labels of the same network re-expressed in radserve's (z, y, x) order."""
    kernel = np.random.default_rng(3).normal(size=(2, 1, 3, 3, 3)).astype(np.float32)
    # Sizes whose window grids are symmetric, so reversing an axis moves no patch.
    vol = Volume.from_geometry(_volume((12, 16, 20), 1), spacing=(1.0, 1.0, 1.0))
    want = _run(tmp_path, "default", np.ascontiguousarray(to_default(kernel)), vol)  # type: ignore[operator]
    got = _run(tmp_path, "declared", kernel, vol, axes=axes)
    assert got.labels.same_geometry(vol)
    assert 0.05 < want.labels.array.mean() < 0.95
    assert (got.labels.array == want.labels.array).mean() > 0.9995
    assert np.abs(got.confidence.array.astype(int) - want.confidence.array).max() <= 1


def test_anisotropic_spacing_follows_the_declared_order(tmp_path: Path) -> None:
    """spacing and patch_size are in the network's order: (x, y, z) spacing (1, 1, 2)
    halves the slices, not the columns; the label map still lands on the native grid."""
    hu = np.full((16, 20, 24), -1000, np.int16)
    hu[4:12, 6:14, 5:19] = 1000
    vol = Volume.from_geometry(hu, spacing=(1.0, 1.0, 1.0))
    w = np.zeros((2, 1, 1, 1, 1), np.float32)
    w[1] = 20.0
    path = conv_model(tmp_path / "t.onnx", w, np.array([0.0, -10.0], np.float32))
    spec = model_spec(
        mode="3d", spacing=(1.0, 1.0, 2.0), patch_size=(8, 8, 4), axes=["x", "y", "z"]
    )
    task = PatchTask(vol, spec, crop_to_body=False)
    assert task._grid == (24, 20, 8)  # (x, y, z) at (1, 1, 2) mm
    pred = run_task(task, ModelSession(path, spec, runtime=CPU))
    got = pred.labels.array.astype(bool)
    assert got[5:11, 7:13, 6:18].all() and got.sum() == pytest.approx((hu > 0).sum(), rel=0.1)


def test_patient_axes_follow_the_affine() -> None:
    """Directions come from the affine: a sagittal stack and a feet-first one."""
    # slices towards L, rows towards I (reversed S), columns towards P
    sagittal = np.array([[1.0, 0, 0], [0, 0, 1.0], [0, -1.0, 0]])
    m = axis_map(
        ("R", "A", "S"),
        Volume.from_geometry(np.zeros((2, 3, 4)), spacing=(1, 1, 1), direction=sagittal).affine,
    )
    assert m.perm == (0, 2, 1) and m.flip == (True, True, True)
    axial_ff = np.eye(3)[:, ::-1] * np.array([-1.0, 1.0, 1.0])  # slices towards I
    m = axis_map(
        ("L", "P", "S"),
        Volume.from_geometry(np.zeros((2, 3, 4)), spacing=(1, 1, 1), direction=axial_ff).affine,
    )
    assert m.perm == (2, 1, 0) and m.flip == (False, False, True)
    # the reoriented volume places every voxel where the original did
    vol = Volume.from_geometry(
        np.arange(24.0).reshape(2, 3, 4), spacing=(2, 3, 4), origin=(5, 6, 7), direction=sagittal
    )
    seen = axis_map(("R", "A", "S"), vol.affine).volume(vol)
    assert seen.shape == (2, 4, 3)
    for idx in np.ndindex(seen.shape):
        src = np.argwhere(vol.array == seen.array[idx])[0]
        np.testing.assert_allclose(seen.affine @ [*idx, 1], vol.affine @ [*src, 1])


@pytest.mark.parametrize(
    ("axes", "message"),
    [
        (["z", "y"], "three axes"),
        (["z", "z", "x"], "an index axis repeats"),
        (["R", "L", "S"], "two letters on one patient axis"),
        (["x", "A", "S"], "index axes and directions mixed"),
        (["i", "j", "k"], "are neither"),
    ],
)
def test_wrong_axes_are_refused_clearly(axes: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model_spec(mode="3d", spacing=(1.0, 1.0, 1.0), patch_size=(8, 8, 8), axes=axes)


def test_axes_need_a_3d_model_and_a_slice_spacing() -> None:
    with pytest.raises(ValueError, match="reads the volume's slices, so its index axes start"):
        model_spec(mode="2d", axes=["x", "y", "z"])
    assert model_spec(mode="2d").input.network_axes == ("S", "P", "L")
    assert model_spec(mode="2d", axes=["z", "x", "y"]).input.network_axes == ("z", "x", "y")
    assert model_spec(mode="2d", axes=["L", "A", "S"]).input.axes == ("L", "A", "S")
    with pytest.raises(ValueError, match="spacing\\[0\\] null"):
        model_spec(mode="3d", spacing=(None, 1.0, 1.0), patch_size=(8, 8, 8), axes=["R", "A", "S"])
