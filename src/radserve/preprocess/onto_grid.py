"""One series onto another's grid through patient coordinates (PET onto CT).

Multi-series models (``input.channels``) take each channel on the reference series'
voxels. Both volumes' affines map indices to patient millimetres in one Frame of
Reference (the caller checks it is one), so the reference voxel ``i`` samples the source
at index ``inv(A_src) @ A_ref @ i``: trilinear (``order=1``) for images, zero (``cval``)
outside the source's field of view. Voxel centres are the sample points, the convention
of :class:`~radserve.domain.volume.Volume`. Two series on one grid (the sequences of one
MR acquisition) keep their own voxels bit for bit: trilinear weights a rounding error
away from 0 and 1 would otherwise leak a 1e-16 share of a neighbour into every voxel,
enough to make a zero voxel non-zero (MONAI's ``NormalizeIntensity(nonzero)``).
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import affine_transform

from radserve.domain.volume import Volume
from radserve.preprocess.resample import check_grid

__all__ = ["resample_onto"]


def resample_onto(
    source: Volume, reference: Volume, *, order: int = 1, cval: float = 0.0
) -> Volume:
    """``source`` sampled at ``reference``'s voxel centres (float32, reference geometry)."""
    check_grid(reference.shape)
    to_source = np.linalg.inv(source.affine) @ reference.affine
    if source.shape == reference.shape and np.allclose(to_source, np.eye(4), rtol=0, atol=1e-6):
        return reference.with_array(source.array.astype(np.float32))  # one grid
    out = affine_transform(
        source.array.astype(np.float32, copy=False),
        to_source[:3, :3],
        offset=to_source[:3, 3],
        output_shape=reference.shape,
        output=np.float32,
        order=order,
        mode="constant",
        cval=cval,
    )
    return reference.with_array(out)
