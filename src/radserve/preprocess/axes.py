"""Which way a network's three axes run (``input.axes`` in model.yaml).

radserve holds a volume as (slice, row, column) = ``z, y, x``, the order nnU-Net and
SimpleITK's arrays use, and that is the default. A network trained on another order
declares it, in one of two forms:

* **Index axes**, a permutation of ``z``, ``y``, ``x``: ``[x, y, z]`` is a network that
  takes (column, row, slice) arrays, as NiBabel- or ITK-loaded NIfTI gives them
  without reorientation. No axis is reversed.
* **Patient directions**, one of R/L, A/P, S/I per axis, in MONAI's (and NiBabel's)
  ``Orientation(axcodes=...)`` sense: axis ``i`` runs *towards* its letter, so
  ``[R, A, S]`` is an array whose first index grows towards the patient's right. The
  volume is reoriented from its own affine, as MONAI does, so an axial, sagittal or
  feet-first series all reach the network the same way round.

The rest of the 3D model's declaration (``spacing``, ``patch_size``) is in the
network's order. :class:`AxisMap` gives views (never copies) from the volume's order to
the network's, so outputs are written back through the same view.

A 2d/2.5d model reads the volume's own slices (:func:`slice_plane`): its rows and
columns are turned in-plane and the order of its context reversed as its axes ask
(by default :data:`~radserve.models.axes.SLICE_AXES`), and a series whose slices lie in
another plane than the network's is refused (:class:`OrientationError`). Series selection
asks first (:func:`plane_mismatch`, on the series' headers) and passes such a series over
for the next qualifying one in the model's plane (``radserve.pipeline.selection``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radserve.domain.volume import Volume
from radserve.errors import StudyError
from radserve.models.axes import DIRECTIONS, INDEX_AXES, check_axes


class OrientationError(StudyError):
    """The series' slices lie in another plane than those a slice model reads."""

    code = "orientation_unsupported"
    depends_on_model = True  # a model trained on that plane may take it


def volume_orientation(affine: np.ndarray) -> list[tuple[int, int]]:
    """(LPS world axis, sign) each index axis runs along, as NiBabel's ``io_orientation``
    finds it (closest orthogonal matrix, then greedily per index axis) so an oblique
    volume is reoriented the way MONAI's ``Orientation`` does."""
    rs = np.asarray(affine, np.float64)[:3, :3]
    rs = rs / np.linalg.norm(rs, axis=0)[None, :]
    u, _, vt = np.linalg.svd(rs)
    rot = u @ vt
    out: list[tuple[int, int]] = []
    for j in range(3):
        col = rot[:, j]
        w = int(np.argmax(np.abs(col)))
        out.append((w, 1 if col[w] > 0 else -1))
        rot[w, :] = 0.0
    return out


@dataclass(frozen=True)
class AxisMap:
    """Network axis ``i`` is volume axis ``perm[i]``, reversed where ``flip[i]``."""

    perm: tuple[int, int, int] = (0, 1, 2)
    flip: tuple[bool, bool, bool] = (False, False, False)

    @property
    def identity(self) -> bool:
        return self.perm == (0, 1, 2) and not any(self.flip)

    def inverse(self) -> AxisMap:
        """The map from the network's order back to the volume's."""
        back = tuple(self.perm.index(j) for j in range(3))
        return AxisMap(back, tuple(self.flip[i] for i in back))  # type: ignore[arg-type]

    def shape(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """A volume-order (z, y, x) shape in network order."""
        return tuple(int(shape[p]) for p in self.perm)  # type: ignore[return-value]

    def view(self, array: np.ndarray) -> np.ndarray:
        """``array`` (its last three axes in volume order) seen in network order."""
        if self.identity:
            return array
        lead = array.ndim - 3
        out = array.transpose(*range(lead), *(lead + p for p in self.perm))
        return out[(Ellipsis, *(slice(None, None, -1) if f else slice(None) for f in self.flip))]

    def volume(self, volume: Volume) -> Volume:
        """``volume`` reoriented (a view) with the affine that still places each voxel."""
        if self.identity:
            return volume
        affine = np.eye(4)
        origin = volume.affine[:3, 3].copy()
        for i, (p, f) in enumerate(zip(self.perm, self.flip, strict=True)):
            step = volume.affine[:3, p]
            if f:
                origin += step * (volume.shape[p] - 1)
            affine[:3, i] = -step if f else step
        affine[:3, 3] = origin
        return Volume(self.view(volume.array), affine, volume.frame_of_reference_uid)


def axis_map(axes: tuple[str, ...], affine: np.ndarray) -> AxisMap:
    """How to view a volume with ``affine`` as a network declaring ``axes`` sees it."""
    axes = check_axes(axes)
    if axes[0] in INDEX_AXES:
        return AxisMap(tuple(INDEX_AXES.index(a) for a in axes))  # type: ignore[arg-type]
    have = volume_orientation(affine)
    perm: list[int] = []
    flip: list[bool] = []
    for a in axes:
        world, sign = DIRECTIONS[a]
        j = next(j for j, (w, _) in enumerate(have) if w == world)
        perm.append(j)
        flip.append(have[j][1] != sign)
    return AxisMap(tuple(perm), tuple(flip))  # type: ignore[arg-type]


_PLANES = {0: "sagittal", 1: "coronal", 2: "axial"}  # by the LPS axis of the slice normal


def slice_plane(axes: tuple[str, ...], affine: np.ndarray, model: str) -> AxisMap:
    """How a slice model declaring ``axes`` sees each slice of a volume with ``affine``:
    a map that keeps the slice axis first (rows and columns swapped and reversed as
    needed; ``flip[0]``: the slices run the other way, so the 2.5D context is read in
    reverse). Raises :class:`OrientationError` when the network's slices are not the
    volume's: an axial model cannot be run on coronal slices, slice by slice."""
    found = axis_map(axes, affine)
    planes = _other_plane(axes, affine, found)
    if planes is None:
        return found
    raise orientation_error(model, *planes)


def orientation_error(model: str, have: str, wanted: str) -> OrientationError:
    """The refusal of a series whose slices are ``have`` by a model that reads
    ``wanted`` slices (planes as :func:`plane_mismatch` names them)."""
    return OrientationError(
        f"the series' slices are {have}, and model {model} reads {wanted} slices: send the "
        f"study's {wanted} series (or a model whose model.yaml declares the plane it was "
        "trained on in input.axes)"
    )


def plane_mismatch(axes: tuple[str, ...], affine: np.ndarray) -> tuple[str, str] | None:
    """(the volume's slice plane, the plane a slice model declaring ``axes`` reads) when
    they differ, else None: what :func:`slice_plane` refuses, asked before a series is
    loaded (series selection passes such a series over for one the model reads)."""
    return _other_plane(axes, affine, axis_map(axes, affine))


def _other_plane(
    axes: tuple[str, ...], affine: np.ndarray, found: AxisMap
) -> tuple[str, str] | None:
    if found.perm[0] == 0:
        return None
    have = volume_orientation(affine)
    world = DIRECTIONS[axes[0]][0] if axes[0] in DIRECTIONS else have[found.perm[0]][0]
    return _PLANES[have[0][0]], _PLANES[world]


__all__ = [
    "AxisMap",
    "OrientationError",
    "axis_map",
    "orientation_error",
    "plane_mismatch",
    "slice_plane",
    "volume_orientation",
]
