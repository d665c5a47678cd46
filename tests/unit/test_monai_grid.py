"""radserve.preprocess.monai_grid: MONAI's Invertd coordinates, bit for bit.

MONAI (preprocessing with CropForegroundd, then Invertd) runs on NIfTI files of random
axis-aligned geometries (spacings, origins, flips, permutations, axcodes, boxes past the
image); ``grid_sample``'s grid is captured and unnormalised as ATen does, and compared
with :func:`back_coordinates` without tolerance. On random oblique geometries (tilted
about one or two axes) what the coordinates decide is compared at every voxel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radserve.errors import ModelError
from radserve.preprocess.monai_grid import (
    back_coordinates,
    forward_coordinates,
    torch_linspace_base,
)

SPACINGS = [0.5, 0.625, 0.7, 0.703125, 0.75, 0.78125, 0.8, 0.9, 0.9765625, 1.0, 1.1, 1.2]
SPACINGS += [1.25, 1.5, 1.6, 2.0, 2.5, 3.0, 5.0]


def test_linspace_base_is_torchs() -> None:
    torch = pytest.importorskip("torch")
    for n in range(1, 700):
        want = (torch.linspace(-1, 1, n, dtype=torch.float64) * (n - 1) / n).numpy()
        assert np.array_equal(torch_linspace_base(n), want), n


def _monai_grid(
    nifti: Path, axcodes: str, pixdim: list[float], margin: int, k: int, monkeypatch: Any
) -> tuple[Any, Any, tuple[int, ...], Any]:
    """MONAI's Spacing and Invertd grids (unnormalised, clipped; None where MONAI does
    not resample), the model grid's shape and MONAI's box."""
    import torch
    from monai.transforms import (
        Compose,
        CropForeground,
        CropForegroundd,
        EnsureChannelFirstd,
        Invertd,
        LoadImaged,
        Orientationd,
        ScaleIntensityRanged,
        Spacingd,
    )

    grids: list[Any] = []
    sample = torch.nn.functional.grid_sample

    def capture(input: Any, grid: Any, **kw: Any) -> Any:
        grids.append((tuple(input.shape[2:]), grid[0].numpy().copy()))
        return sample(input, grid, **kw)

    monkeypatch.setattr(torch.nn.functional, "grid_sample", capture)
    pre = [
        LoadImaged("image"),
        EnsureChannelFirstd("image"),
        Orientationd("image", axcodes=axcodes),
        Spacingd("image", pixdim=pixdim, mode="bilinear"),
        ScaleIntensityRanged("image", a_min=-57, a_max=164, b_min=0.0, b_max=1.0, clip=True),
    ]
    scaled = Compose(pre)({"image": str(nifti)})["image"]
    forward = _unnormalised(*grids[-1]) if grids else None  # Spacing's own grid
    box = CropForeground(margin=margin, k_divisible=k).compute_bounding_box(scaled)
    crop = CropForegroundd("image", source_key="image", margin=margin, k_divisible=k)
    compose = Compose([*pre, crop])
    data = compose({"image": str(nifti)})
    data["pred"] = data["image"].clone()
    grids.clear()
    Invertd("pred", transform=compose, orig_keys="image", nearest_interp=False)(data)
    back = _unnormalised(*grids[-1]) if grids else None
    return forward, back, tuple(scaled.shape[1:]), box


def _unnormalised(sizes: tuple[int, ...], grid: np.ndarray) -> list[np.ndarray]:
    """Per axis, (output voxels along it, the rest) of ``grid_sample``'s source index."""
    coords = []
    for axis in range(3):  # grid[..., 0] is the last axis (x), as torch orders it
        u = ((grid[..., 2 - axis] + 1) * sizes[axis] - 1) / 2
        u = np.minimum(sizes[axis] - 1, np.maximum(u, 0))
        coords.append(np.moveaxis(u, axis, 0).reshape(u.shape[axis], -1))
    return coords


def _same(got: list[np.ndarray], want: list[np.ndarray] | None, where: Any) -> None:
    if want is None:  # MONAI found the grids equal and did not resample
        assert all(np.array_equal(c, np.arange(len(c))) for c in got), where
        return
    for axis in range(3):
        assert (want[axis] == want[axis][:, :1]).all()  # one coordinate per row
        assert np.array_equal(got[axis], want[axis][:, 0]), (where, axis)


@pytest.mark.parametrize("seed", range(4))
def test_back_coordinates_are_monais(tmp_path: Path, seed: int, monkeypatch: Any) -> None:
    pytest.importorskip("monai")
    import nibabel as nib

    rng = np.random.default_rng(seed)
    for trial in range(6):
        shape = tuple(int(x) for x in rng.integers(6, 48, 3))
        spacing = [float(rng.choice(SPACINGS)) for _ in range(3)]
        pixdim = [float(rng.choice([0.8, 1.0, 1.2, 1.5, 2.0, 3.0])) for _ in range(3)]
        affine = np.eye(4)
        affine[:3, :3] = 0.0
        for j, (i, sign) in enumerate(zip(rng.permutation(3), rng.choice([-1, 1], 3), strict=True)):
            affine[i, j] = sign * spacing[j]
        affine[:3, 3] = np.round(rng.uniform(-200, 200, 3), int(rng.integers(0, 4)))
        axcodes = str(rng.choice(["RAS", "PLI", "LPS", "SAR"]))
        data = np.zeros(shape, np.float32)
        lo = [int(rng.integers(0, n // 2)) for n in shape]
        hi = [int(rng.integers(n // 2 + 1, n + 1)) for n in shape]
        data[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]] = 100.0
        nifti = tmp_path / f"{trial}.nii.gz"
        nib.save(nib.Nifti1Image(data, affine), nifti)
        margin, k = int(rng.choice([0, 2, 20])), int(rng.choice([1, 8, 16]))
        forward, back, sizes, box = _monai_grid(nifti, axcodes, pixdim, margin, k, monkeypatch)
        got, model_shape = forward_coordinates(affine, shape, axcodes, pixdim)  # type: ignore[arg-type]
        assert model_shape == sizes
        _same(got, forward, ("forward", seed, trial))
        got, model_shape = back_coordinates(affine, shape, axcodes, pixdim, box)  # type: ignore[arg-type]
        assert model_shape == sizes
        _same(got, back, ("back", seed, trial))


def _tilted(rng: np.random.Generator) -> np.ndarray:
    """A RAS affine tilted about one patient axis (a gantry tilt) or two."""
    angles = rng.uniform(-0.35, 0.35, 2) * (rng.random(2) < [1.0, 0.4])
    c, s = np.cos(angles), np.sin(angles)
    about_x = np.array([[1, 0, 0], [0, c[0], -s[0]], [0, s[0], c[0]]])
    about_z = np.array([[c[1], -s[1], 0], [s[1], c[1], 0], [0, 0, 1]])
    affine = np.eye(4)
    spacing = [float(rng.choice(SPACINGS)) for _ in range(3)]
    affine[:3, :3] = about_z @ about_x @ np.diag(spacing)
    affine[:3, 3] = np.round(rng.uniform(-200, 200, 3), 2)
    return affine


@pytest.mark.parametrize("seed", range(2))
def test_oblique_coordinates_decide_as_monais(tmp_path: Path, seed: int, monkeypatch: Any) -> None:
    """On an oblique series MONAI's grid varies by ulps across a row; wherever that can
    matter (a row near a half voxel for nearest, near a zero voxel beside the box for
    bilinear) radserve takes MONAI's coordinate voxel by voxel, so nearest's pick and
    bilinear's non-zero neighbours there are MONAI's at every voxel (or the series is
    refused by name)."""
    pytest.importorskip("monai")
    import nibabel as nib

    from radserve.preprocess.monai_grid import _decisions

    rng = np.random.default_rng(100 + seed)
    compared = refused = 0
    for trial in range(5):
        shape = tuple(int(x) for x in rng.integers(8, 40, 3))
        affine = _tilted(rng)
        pixdim = [float(rng.choice([0.75, 1.0, 1.5, 2.0])) for _ in range(3)]
        data = np.zeros(shape, np.float32)
        data[2:-2, 3:-1, 1:-3] = 100.0
        nifti = tmp_path / f"{trial}.nii.gz"
        nib.save(nib.Nifti1Image(data, affine), nifti)
        forward, back, sizes, box = _monai_grid(nifti, "RAS", pixdim, 0, 1, monkeypatch)
        assert forward is not None and back is not None
        checks = [(back, 0), (back, 1), (forward, 0)]  # the grid, what it decides
        for k, (want, order) in enumerate(checks):
            try:
                if k < 2:
                    got, model_shape = back_coordinates(
                        affine, shape, "RAS", pixdim, box, order=order
                    )  # type: ignore[arg-type]
                else:
                    got, model_shape = forward_coordinates(affine, shape, "RAS", pixdim, order=0)  # type: ignore[arg-type]
            except ModelError as exc:
                assert "straddles a tie across the slice" in str(exc)
                refused += 1
                continue
            assert model_shape == sizes
            compared += 1
            for axis in range(3):
                decided = _decisions(want[axis], order)
                same = decided == _decisions(got[axis], order)[:, None]
                if order == 1:  # bilinear: only the zero voxels beside the box matter
                    lo, hi = max(int(box[0][axis]), 0), min(int(box[1][axis]), sizes[axis])
                    same |= ~np.isin(np.rint(want[axis]), [lo - 1, hi])
                assert same.all(), (trial, k, axis)
    print(f"seed {seed}: {compared} grids decide as MONAI's, {refused} refused")
    assert compared >= 5


def test_a_row_straddling_a_tie_is_refused() -> None:
    """A row whose voxels fall on both sides of a whole voxel (an off-axis term far
    above rounding noise) would give MONAI's labels only at some voxels: refused."""
    from radserve.preprocess.monai_grid import _exact_rows

    bases = [torch_linspace_base(n) for n in (4, 6, 6)]
    theta = np.zeros((3, 4))
    theta[0, 0], theta[0, 1] = 1.0, 1e-3  # axis 0 leans on axis 1
    u = ((bases[0] + 1.0) * 4 - 1.0) / 2.0  # 0, 1, 2, 3: whole voxels
    with pytest.raises(ModelError, match="voxel 0, straddles a tie across the slice"):
        _exact_rows(u, 0, theta, bases, 4, order=1)
    theta[0, 1] = 1e-17  # rounding noise: the rows decide alike
    assert np.array_equal(_exact_rows(u, 0, theta, bases, 4, order=1), u)
