"""Where MONAI's ``Invertd`` samples the model grid, to the last bit (``crop_foreground``).

With ``CropForeground(d)`` MONAI pads the cropped outputs with zeros before it resamples
them back (``Invertd`` -> the inverse of ``Spacing(d)``: ``spatial_resample`` ->
``AffineTransform`` -> ``affine_grid`` / ``grid_sample`` in float64). A native voxel whose
back-coordinate is a whole model voxel just outside the box (every 5th row for
1.2 -> 1.5 mm) reads zeros plus the in-box neighbour times the rounding error of that
coordinate, so MONAI's label there (background, or the neighbour's class) is decided by
the last bit of the coordinate. This module repeats MONAI 1.6's float arithmetic step by
step, for the series as MONAI reads it from NIfTI (the affine stored in float32, as
nibabel and dcm2niix write it):

* the RAS affine, reoriented (``Orientation``: NiBabel's ``inv_ornt_aff``), the
  ``Spacing`` target (``zoom_affine``, ``compute_shape_offset``) and the model grid's
  affine (``solve`` then a matrix product), the crop and pad translations and their
  inverses, as MONAI's ``track_transform_meta`` composes them;
* the inverse ``Spacing``: ``solve(model, original)``, ``to_norm_affine`` and, per axis,
  torch's ``linspace`` (fused multiply-add, as ATen's CPU kernel is compiled), the
  ``affine_grid`` product and ``grid_sample``'s unnormalisation and border clip
  (:func:`back_coordinates`); the same for ``Spacing`` itself, from
  ``solve(original, target)`` (:func:`forward_coordinates`: the model grid's values
  then come from MONAI's sampling points too, so the box sees MONAI's image).

Matrix products use NumPy: every product here has at most two non-zero terms per entry
(axis-aligned affines), so MKL, OpenBLAS and NumPy round them alike. An oblique series
(direction cosines off the axes) makes every entry a sum of several terms whose order
is the BLAS library's own; :func:`back_coordinates` refuses it rather than guess.
Checked bit for bit against MONAI's own grid (tests/unit/test_monai_grid.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from radserve.errors import ModelError

_AFFINE_TOL = 1e-3  # monai.utils.misc.AFFINE_TOL


def _fma(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once (the fused multiply-add ATen's CPU kernels use)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def _translate(shift: Sequence[float]) -> np.ndarray:
    t = np.eye(4)
    t[:3, 3] = shift
    return t


def torch_linspace_base(n: int) -> np.ndarray:
    """``affine_grid``'s base coordinates for ``n`` voxels (align_corners False):
    ``torch.linspace(-1, 1, n) * (n - 1) / n`` in float64, as ATen computes it."""
    if n == 1:
        values = np.array([-1.0])
    else:
        step = (1.0 - -1.0) / (n - 1)
        half = n // 2
        values = np.array(
            [
                _fma(step, float(i), -1.0) if i < half else _fma(-step, float(n - i - 1), 1.0)
                for i in range(n)
            ]
        )
    return values * float(n - 1) / float(n)


def nifti_affine(ras: np.ndarray) -> np.ndarray:
    """The RAS affine as MONAI reads it back from NIfTI (sform stored in float32)."""
    return np.asarray(ras, np.float32).astype(np.float64)


def _oriented(
    ras: np.ndarray, shape: tuple[int, int, int], axcodes: str
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``Orientation(axcodes)``'s affine (MONAI: ``ras @ inv_ornt_aff``) and shape."""
    import nibabel as nib

    ornt = nib.orientations.ornt_transform(
        nib.io_orientation(ras), nib.orientations.axcodes2ornt(axcodes)
    )
    out = [0, 0, 0]
    for axis, (to, _) in enumerate(ornt):
        out[int(to)] = int(shape[axis])
    return ras @ nib.orientations.inv_ornt_aff(ornt, shape), tuple(out)  # type: ignore[return-value]


def _spacing_target(
    affine: np.ndarray, shape: tuple[int, int, int], pixdim: Sequence[float]
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``Spacing``'s target affine and shape (``zoom_affine``, ``compute_shape_offset``
    with diagonal and scale_extent False)."""
    out_d = np.asarray(pixdim, float).copy()
    orig_d = np.sqrt(np.sum(affine[:3, :3] * affine[:3, :3], axis=0))  # affine_to_spacing
    for i, d in enumerate(orig_d):  # Spacing keeps a spacing within AFFINE_TOL of pixdim
        if out_d[i] - _AFFINE_TOL <= d <= out_d[i] + _AFFINE_TOL:
            out_d[i] = d
    rzs = affine[:-1, :-1]
    zs = np.linalg.cholesky(rzs.T @ rzs).T
    rotation = rzs @ np.linalg.inv(zs)
    s = np.sign(np.diag(zs)) * np.abs(out_d)
    new = np.eye(4)
    new[:-1, :-1] = rotation @ np.diag(s)
    dims = np.asarray(shape, float)
    corners = np.asarray(np.meshgrid(*[(0.0, d - 1.0) for d in dims], indexing="ij"))
    corners = np.concatenate((corners.reshape(3, -1), np.ones((1, 8))))
    out = np.linalg.solve(new, affine) @ corners
    all_dist = out[:-1].copy()
    out = out[:-1] / out[-1]
    out_shape = np.round(np.ptp(out, axis=1) + 1.0)
    world = affine @ corners
    offset = None
    for i in range(corners.shape[1]):
        if np.allclose(np.min(all_dist - all_dist[:, i : i + 1], 1), 0.0, rtol=_AFFINE_TOL):
            offset = world[:-1, i]
            break
    if offset is None:  # no corner is the smallest (MONAI centres the grids instead)
        raise ModelError("MONAI Spacing: the grids are centred, not corner-aligned")
    new[:-1, -1] = offset
    return new, tuple(int(v) for v in out_shape)  # type: ignore[return-value]


def _is_axis_aligned(affine: np.ndarray) -> bool:
    """One non-zero per row and column of the 3x3 part (flips and permutations only)."""
    nz = affine[:3, :3] != 0
    return bool((nz.sum(axis=0) == 1).all() and (nz.sum(axis=1) == 1).all())


@dataclass(frozen=True)
class _Geometry:
    """MONAI's affines and shapes for one series: after ``Orientation`` (``oriented``,
    ``native``), ``Spacing``'s target and the model grid's affine as ``Spacing`` leaves
    it on the image (``model``, ``model_shape``)."""

    oriented: np.ndarray
    native: tuple[int, int, int]
    target: np.ndarray
    model: np.ndarray
    model_shape: tuple[int, int, int]


def _geometry(
    ras: np.ndarray, shape: tuple[int, int, int], axcodes: str, pixdim: Sequence[float]
) -> _Geometry:
    """MONAI's ``Orientation`` and ``Spacing`` arithmetic; an oblique series refused."""
    ras = nifti_affine(ras)
    if not _is_axis_aligned(ras):
        raise ModelError(
            "MONAI's exact grid (crop_foreground, nearest resampling): an oblique series "
            "(direction cosines off the axes): MONAI's resampling sums several rounded terms "
            "per coordinate in its BLAS library's order, which radserve does not reproduce; "
            "the labels at the crop box's edge and at nearest's half-voxel ties would not "
            "be MONAI's"
        )
    oriented, native = _oriented(ras, shape, axcodes)
    target, model_shape = _spacing_target(oriented, native, pixdim)
    xform = np.linalg.solve(oriented, target)
    if model_shape == native and np.allclose(xform, np.eye(4), atol=_AFFINE_TOL):
        model = oriented  # MONAI keeps the image and its affine
    else:
        model = oriented @ xform
    return _Geometry(oriented, native, target, model, model_shape)


def _sampled_at(
    xform: np.ndarray, src: tuple[int, int, int], dst: tuple[int, int, int]
) -> list[np.ndarray]:
    """Per axis, where ``spatial_resample`` reads ``src`` for each ``dst`` voxel
    (``AffineTransform``: ``to_norm_affine``, ``affine_grid``, ``grid_sample``'s
    unnormalisation, border clip); a voxel grid when MONAI skips the resampling."""
    if src == dst and np.allclose(xform, np.eye(4), atol=_AFFINE_TOL):
        return [np.arange(n, dtype=np.float64) for n in dst]
    theta = _normalize(src) @ xform @ np.linalg.inv(_normalize(dst))
    coords = []
    for axis, (n_dst, n_src) in enumerate(zip(dst, src, strict=True)):
        g = torch_linspace_base(n_dst) * theta[axis, axis] + theta[axis, 3]
        u = ((g + 1.0) * float(n_src) - 1.0) / 2.0
        coords.append(np.minimum(float(n_src - 1), np.maximum(u, 0.0)))
    return coords


def forward_coordinates(
    ras: np.ndarray, shape: tuple[int, int, int], axcodes: str, pixdim: Sequence[float]
) -> tuple[list[np.ndarray], tuple[int, int, int]]:
    """(per network axis, the native coordinate each model voxel is read from; the
    model grid's shape) as MONAI's ``Spacing`` computes them (arguments: see
    :func:`back_coordinates`)."""
    g = _geometry(ras, shape, axcodes, pixdim)
    return _sampled_at(
        np.linalg.solve(g.oriented, g.target), g.native, g.model_shape
    ), g.model_shape


def back_coordinates(
    ras: np.ndarray,
    shape: tuple[int, int, int],
    axcodes: str,
    pixdim: Sequence[float],
    box: tuple[Sequence[int], Sequence[int]],
) -> tuple[list[np.ndarray], tuple[int, int, int]]:
    """(per network axis, the model-grid coordinate each native voxel is read from; the
    model grid's shape) as MONAI's ``Invertd`` computes them after ``CropForeground``.

    ``ras``: the series' RAS affine over its file axes (NIfTI order) of ``shape``;
    ``axcodes``: ``Orientation``'s; ``pixdim``: ``Spacing``'s (network order); ``box``:
    the crop box (start, end) on the model grid, possibly past it."""
    g = _geometry(ras, shape, axcodes, pixdim)
    oriented, native, model, model_shape = g.oriented, g.native, g.model, g.model_shape
    start, end = np.asarray(box[0]), np.asarray(box[1])
    lo, hi = np.maximum(start, 0), np.minimum(end, model_shape)
    pad_before, pad_after = np.maximum(-start, 0), np.maximum(end - np.asarray(model_shape), 0)
    cropped = model @ _translate(lo)  # CropForeground: crop, then pad
    if pad_before.any() or pad_after.any():
        cropped = cropped @ _translate(-pad_before)
    back = cropped @ _translate(pad_before)  # Invertd: the pad's inverse crops
    if lo.any() or (np.asarray(model_shape) - hi).any():
        back = back @ _translate(-lo)  # the crop's inverse pads
    return _sampled_at(np.linalg.solve(back, oriented), model_shape, native), model_shape


def _normalize(shape: Sequence[int]) -> np.ndarray:
    """MONAI's ``normalize_transform`` (align_corners False, not zero-centred)."""
    dims = np.asarray(shape, np.float64)
    norm = np.eye(4)
    norm[np.arange(3), np.arange(3)] = 2.0 / dims
    norm[:3, 3] = 1.0 / dims - 1.0
    return norm
