"""Turn a spec into voxels: labels, then HU with partial-volume blur and noise.

Work is done in z-chunks (bounded memory, shapes evaluated only inside their
bounding boxes). Each chunk is rendered with a halo of slices as wide as the z blur
kernel and the noise of slice k is seeded by (seed, k), so any subset of slices is
bit-identical to the same slices of the full volume.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from pydicom.uid import generate_uid
from scipy.ndimage import gaussian_filter

from radserve.domain.volume import Volume
from radserve.phantom.anatomy import NON_BODY_TISSUES, Anatomy, build_anatomy, paint_anatomy
from radserve.phantom.lesions import Lesion, PlacedLesion, lesion_hu, paint_lesions, place_lesions
from radserve.phantom.shapes import GridCanvas
from radserve.phantom.spec import PhantomSpec, blur_radius

logger = logging.getLogger(__name__)

_CHUNK = 24  # output slices rendered together
_HU_MIN, _HU_MAX = -1024, 3071
_TRUNCATE = 3.0


@dataclass(frozen=True)
class Layout:
    """Everything about a phantom that does not depend on which slices are rendered."""

    anatomy: Anatomy
    lesions: tuple[PlacedLesion, ...]
    hu: np.ndarray


@lru_cache(maxsize=16)
def layout(spec: PhantomSpec) -> Layout:
    """Anatomy and lesions of ``spec``; cached because training calls reuse one spec."""
    anatomy = build_anatomy(spec)
    placed = tuple(place_lesions(spec, anatomy))
    return Layout(anatomy, placed, lesion_hu(list(placed), anatomy.hu, spec.contrast_enhancement))


def frame_of_reference_uid(spec: PhantomSpec) -> str:
    return generate_uid(entropy_srcs=["radserve-phantom", str(spec.seed), "frame-of-reference"])


def sop_instance_uid(spec: PhantomSpec, k: int, salt: str = "") -> str:
    """Deterministic SOP Instance UID of slice ``k`` (``salt`` makes another copy)."""
    size = "small" if spec.small else "full"
    return generate_uid(entropy_srcs=["radserve-phantom", str(spec.seed), size, salt, str(k)])


@dataclass(frozen=True, eq=False)
class Phantom:
    """A generated study: CT in HU, organ labels, lesion instances and their list.

    ``slice_indices`` are the indices (in the full volume of ``spec``) of the slices
    held here. ``tissue`` is the internal tissue-class map (see ``anatomy.Tissue``).
    """

    spec: PhantomSpec
    ct: Volume
    organs: Volume
    lesions: Volume
    lesion_list: list[Lesion]
    tissue: Volume
    slice_indices: tuple[int, ...]

    @property
    def body(self) -> Volume:
        """uint8 mask of the patient (1), excluding air and the table."""
        mask = ~np.isin(self.tissue.array, np.array(NON_BODY_TISSUES, np.uint8))
        return self.tissue.with_array(mask.astype(np.uint8))


def _check_indices(spec: PhantomSpec, slice_indices: Sequence[int] | None) -> np.ndarray:
    if slice_indices is None:
        return np.arange(spec.n_slices)
    idx = np.asarray(list(slice_indices), dtype=np.int64)
    if idx.ndim != 1 or idx.size == 0:
        raise ValueError("slice_indices must be a non-empty sequence of slice numbers")
    if idx.min() < 0 or idx.max() >= spec.n_slices:
        raise ValueError(
            f"slice_indices must lie in 0..{spec.n_slices - 1}, got {idx.min()}..{idx.max()}"
        )
    steps = np.diff(idx)
    if steps.size and (steps.min() <= 0 or steps.max() != steps.min()):
        raise ValueError(
            "slice_indices must be increasing with one constant step (e.g. range(a, b) or "
            "range(a, b, 2)) so the result has one affine; call generate_phantom once per "
            "run for other sets"
        )
    return idx


def _groups(idx: np.ndarray, halo: int) -> list[np.ndarray]:
    """Split requested slices into groups rendered together (halos shared when close)."""
    groups, start = [], 0
    for i in range(1, idx.size + 1):
        if i == idx.size or idx[i] - idx[i - 1] > 2 * halo + 1 or idx[i] - idx[start] >= _CHUNK:
            groups.append(idx[start:i])
            start = i
    return groups


def generate_phantom(spec: PhantomSpec, slice_indices: Sequence[int] | None = None) -> Phantom:
    """Render ``spec`` (all slices, or only ``slice_indices``: increasing, constant step)."""
    t0 = time.perf_counter()
    idx = _check_indices(spec, slice_indices)
    lay = layout(spec)
    qz, qy, qx = spec.body_axes()
    n, rows, cols = idx.size, spec.rows, spec.columns
    ct = np.empty((n, rows, cols), np.int16)
    organs = np.empty((n, rows, cols), np.uint8)
    lesions = np.empty((n, rows, cols), np.uint16)
    tissue = np.empty((n, rows, cols), np.uint8)
    sigma_z = spec.blur_sigma_z_px
    halo = blur_radius(sigma_z, _TRUNCATE)
    out = 0
    for group in _groups(idx, halo):
        lo = max(0, int(group[0]) - halo)
        hi = min(spec.n_slices, int(group[-1]) + halo + 1)
        canvas = GridCanvas(qz[lo:hi], qy, qx)
        paint_anatomy(canvas, lay.anatomy)
        paint_lesions(canvas, list(lay.lesions))
        hu = lay.hu[canvas.tissue]
        if sigma_z > 0 or spec.blur_sigma_px > 0:
            sig = (sigma_z, spec.blur_sigma_px, spec.blur_sigma_px)
            hu = gaussian_filter(hu, sig, mode="nearest", truncate=_TRUNCATE)
        local = group - lo
        for j, k in zip(local, group, strict=True):
            slice_hu = hu[j]
            if spec.noise_sigma_hu > 0:
                rng = np.random.default_rng([spec.seed, 7, int(k)])
                noise = rng.standard_normal((rows, cols), dtype=np.float32)
                slice_hu = slice_hu + np.float32(spec.noise_sigma_hu) * noise
            np.clip(np.rint(slice_hu), _HU_MIN, _HU_MAX, out=slice_hu)
            ct[out] = slice_hu
            out += 1
        sel = slice(out - group.size, out)
        organs[sel] = canvas.organ[local]
        lesions[sel] = canvas.lesion[local]
        tissue[sel] = canvas.tissue[local]

    affine = spec.affine()
    full = idx.size == spec.n_slices
    if not full:
        step = int(idx[1] - idx[0]) if idx.size > 1 else 1
        affine[:3, 3] = affine[:3, 3] + affine[:3, 0] * idx[0]
        affine[:3, 0] = affine[:3, 0] * step
    for_uid = frame_of_reference_uid(spec)
    uids = tuple(sop_instance_uid(spec, k) for k in range(spec.n_slices)) if full else ()

    def vol(array: np.ndarray) -> Volume:
        return Volume(array, affine, for_uid, uids)

    logger.debug(
        "phantom seed=%d: %d slices of %dx%d in %.2f s",
        spec.seed, n, rows, cols, time.perf_counter() - t0,
    )  # fmt: skip
    return Phantom(
        spec=spec,
        ct=vol(ct),
        organs=vol(organs),
        lesions=vol(lesions),
        lesion_list=[p.lesion for p in lay.lesions],
        tissue=vol(tissue),
        slice_indices=tuple(int(k) for k in idx),
    )
