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

Matrix products use NumPy: on axis-aligned affines every product has at most two
non-zero terms per entry, so MKL, OpenBLAS and NumPy round them alike. On an oblique
series (direction cosines off the axes) the entries are sums of several terms; NumPy's
products were measured to give MONAI's ``theta`` bit for bit on tilted series (MONAI
1.6.1, torch 2.13, x86-64 AVX2: tools/measure_monai_oblique.py), and ``theta``'s
off-axis entries are then rounding noise, so a coordinate varies by ulps across a row of
MONAI's grid: :func:`_exact_rows` takes the rows near a tie voxel by voxel, in ATen's
summation order, and refuses a row whose voxels decide differently.
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
    if offset is None:  # no corner is the smallest: MONAI centres the grids
        offset = (
            affine[:-1, :-1] @ (dims / 2.0) + affine[:-1, -1] - new[:-1, :-1] @ (out_shape / 2.0)
        )
    new[:-1, -1] = offset
    return new, tuple(int(v) for v in out_shape)  # type: ignore[return-value]


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
    """MONAI's ``Orientation`` and ``Spacing`` arithmetic."""
    ras = nifti_affine(ras)
    oriented, native = _oriented(ras, shape, axcodes)
    target, model_shape = _spacing_target(oriented, native, pixdim)
    xform = np.linalg.solve(oriented, target)
    if model_shape == native and np.allclose(xform, np.eye(4), atol=_AFFINE_TOL):
        model = oriented  # MONAI keeps the image and its affine
    else:
        model = oriented @ xform
    return _Geometry(oriented, native, target, model, model_shape)


def _sampled_at(
    xform: np.ndarray,
    src: tuple[int, int, int],
    dst: tuple[int, int, int],
    order: int | None,
    edges: list[list[int]] | None = None,
) -> list[np.ndarray]:
    """Per axis, where ``spatial_resample`` reads ``src`` for each ``dst`` voxel
    (``AffineTransform``: ``to_norm_affine``, ``affine_grid``, ``grid_sample``'s
    unnormalisation, border clip); a voxel grid when MONAI skips the resampling.

    ``order`` says what the coordinates decide (see :func:`_decisions`): 0 nearest's
    pick, 1 which neighbours get a non-zero weight (the crop box's zero padding), None
    nothing beyond the value (a bilinear ``Spacing``: ulps do not move a label).
    ``edges``: per axis, the only ``src`` voxels where order 1's weights matter (the
    zero voxels beside the crop box)."""
    if src == dst and np.allclose(xform, np.eye(4), atol=_AFFINE_TOL):
        return [np.arange(n, dtype=np.float64) for n in dst]
    theta = _normalize(src) @ xform @ np.linalg.inv(_normalize(dst))
    bases = [torch_linspace_base(n) for n in dst]
    coords = []
    for axis, n_src in enumerate(src):
        g = bases[axis] * theta[axis, axis] + theta[axis, 3]
        u = ((g + 1.0) * float(n_src) - 1.0) / 2.0
        u = np.minimum(float(n_src - 1), np.maximum(u, 0.0))
        off_axis = [k for k in range(3) if k != axis and theta[axis, k] != 0.0]
        if off_axis and order is not None:  # an oblique series: see _exact_rows
            only = None if edges is None else edges[axis]
            u = _exact_rows(u, axis, theta, bases, n_src, order, only)
        coords.append(u)
    return coords


def _decisions(u: np.ndarray, order: int) -> np.ndarray:
    """What a coordinate decides: nearest's pick (half to even, ATen's ``nearbyint``);
    for bilinear, the lower neighbour and whether the upper one gets any weight."""
    if order == 0:
        return np.rint(u)
    return np.floor(u) * 2 + (u != np.floor(u))


def _exact_rows(
    u: np.ndarray,
    axis: int,
    theta: np.ndarray,
    bases: list[np.ndarray],
    n_src: int,
    order: int,
    only: list[int] | None = None,
) -> np.ndarray:
    """On an oblique series ``theta``'s off-axis entries are rounding noise (~1e-17), so
    MONAI's coordinate along ``axis`` varies by ulps across a row of the grid. That only
    matters at a tie (a whole or half voxel); for each row near one, the coordinate at
    every voxel of the row, as ATen's ``affine_grid`` sums it (x, y, z, then the
    translation: measured equal to MONAI's grid on tilted series, tools/
    measure_monai_oblique.py), replaces the separable value if it decides the same
    everywhere in the row; otherwise MONAI's labels differ within the row, so refused."""
    # how far the off-axis terms move a row's coordinate (|base| <= 1), plus rounding
    spread = sum(abs(theta[axis, k]) for k in range(3) if k != axis) * n_src / 2.0
    spread += 1e-9 * max(1.0, float(n_src))
    near = np.abs(u * 2 - np.rint(u * 2)) / 2 <= spread
    if only is not None:  # bilinear: only the zero voxels beside the box decide a label
        near &= np.isin(np.rint(u), only)
    if not near.any():
        return u
    others = [k for k in range(3) if k != axis]
    a, b = (bases[k] for k in others)
    # ATen sums the network's last axis first (affine_grid's x), then y, then z
    terms = {k: bases[k] * theta[axis, k] for k in range(3)}
    out = u.copy()
    for row in np.flatnonzero(near):
        parts = {others[0]: terms[others[0]][:, None], others[1]: terms[others[1]][None, :]}
        parts[axis] = np.full((1, 1), terms[axis][row])
        g = ((parts[2] + parts[1]) + parts[0]) + theta[axis, 3]
        plane = ((g + 1.0) * float(n_src) - 1.0) / 2.0
        plane = np.minimum(float(n_src - 1), np.maximum(plane, 0.0))
        decided = _decisions(plane, order)
        if (decided != decided.flat[0]).any():
            raise ModelError(
                "MONAI's exact grid on this oblique series: Invertd/Spacing's coordinate "
                f"along network axis {axis}, voxel {row}, straddles a tie across the slice "
                f"({len(a)}x{len(b)} voxels), so MONAI's labels there depend on the "
                "position in the slice; radserve does not reproduce that"
            )
        out[row] = plane.flat[0]
    return out


def forward_coordinates(
    ras: np.ndarray,
    shape: tuple[int, int, int],
    axcodes: str,
    pixdim: Sequence[float],
    *,
    order: int | None = None,
) -> tuple[list[np.ndarray], tuple[int, int, int]]:
    """(per network axis, the native coordinate each model voxel is read from; the
    model grid's shape) as MONAI's ``Spacing`` computes them (arguments: see
    :func:`back_coordinates`; ``order`` 0 for a nearest ``Spacing``)."""
    g = _geometry(ras, shape, axcodes, pixdim)
    return _sampled_at(
        np.linalg.solve(g.oriented, g.target), g.native, g.model_shape, order
    ), g.model_shape


def back_coordinates(
    ras: np.ndarray,
    shape: tuple[int, int, int],
    axcodes: str,
    pixdim: Sequence[float],
    box: tuple[Sequence[int], Sequence[int]],
    *,
    order: int | None = 1,
) -> tuple[list[np.ndarray], tuple[int, int, int]]:
    """(per network axis, the model-grid coordinate each native voxel is read from; the
    model grid's shape) as MONAI's ``Invertd`` computes them after ``CropForeground``.

    ``ras``: the series' RAS affine over its file axes (NIfTI order) of ``shape``;
    ``axcodes``: ``Orientation``'s; ``pixdim``: ``Spacing``'s (network order); ``box``:
    the crop box (start, end) on the model grid, possibly past it; ``order``: 0 for a
    nearest ``Invertd``, 1 bilinear (onto the box's zero padding)."""
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
    # bilinear: a label follows the last bit only at a zero voxel beside the box
    edges = [
        [k for k in (a - 1, b) if 0 <= k < n] for a, b, n in zip(lo, hi, model_shape, strict=True)
    ]
    xform = np.linalg.solve(back, oriented)
    coords = _sampled_at(xform, model_shape, native, order, edges if order == 1 else None)
    return coords, model_shape


def _normalize(shape: Sequence[int]) -> np.ndarray:
    """MONAI's ``normalize_transform`` (align_corners False, not zero-centred)."""
    dims = np.asarray(shape, np.float64)
    norm = np.eye(4)
    norm[np.arange(3), np.arange(3)] = 2.0 / dims
    norm[:3, 3] = 1.0 / dims - 1.0
    return norm
