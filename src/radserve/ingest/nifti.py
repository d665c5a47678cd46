"""NIfTI in and out, through the Volume's own NIfTI convention (RAS, (i, j, k) order).

Integer data stays integer: an int16 volume is written as int16 with no scaling, and a
file whose scaling is integral and fits int16 is read back as int16.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import nibabel as nib
import numpy as np

from radserve.domain.volume import Volume
from radserve.errors import StudyError

_INT16 = np.iinfo(np.int16)
_INVALID = "nifti_invalid"


def load_nifti(path: Path | str) -> Volume:
    """Read a 3-D NIfTI-1/2 file (a trailing singleton 4th axis is allowed) into a Volume.

    Raises:
        StudyError: code ``nifti_invalid`` when the file is not a readable 3-D NIfTI
            image with a usable affine.
    """
    try:
        image = nib.load(str(path), mmap=False)
    except Exception as exc:  # nibabel raises many types on damaged files
        raise StudyError(
            f"not a readable NIfTI file ({type(exc).__name__})",
            code=_INVALID,
        ) from exc
    if not isinstance(image, nib.Nifti1Image | nib.Nifti2Image):
        raise StudyError(f"expected NIfTI, got {type(image).__name__}", code=_INVALID)
    shape = image.shape
    while len(shape) > 3 and shape[-1] == 1:
        shape = shape[:-1]
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3:
        raise StudyError(f"NIfTI image must be 3-D, got shape {image.shape}", code=_INVALID)
    affine = image.affine
    if abs(np.linalg.det(affine[:3, :3])) < 1e-12:
        raise StudyError("NIfTI affine is singular", code=_INVALID)
    try:
        data = _read_data(image).reshape(shape)
    except Exception as exc:
        raise StudyError(
            f"NIfTI voxel data could not be read ({type(exc).__name__})",
            code=_INVALID,
        ) from exc
    return Volume.from_nifti_arrays(data, affine)


def save_nifti(
    volume: Volume, path: Path | str, *, label_map: bool = False, fileobj: BinaryIO | None = None
) -> Path:
    """Write ``volume`` as NIfTI-1 (``.nii`` or ``.nii.gz``) with sform and, when the
    affine has no shear, qform set to the same scanner-space affine.

    The one NIfTI writer of the package (ingest round trips, report label maps, phantom
    ground truth). ``label_map`` marks the file NIFTI_INTENT_LABEL for viewers.
    ``fileobj``: the bytes of the single-file image go there (already compressing, for
    ``.nii.gz``: the report's label maps use :mod:`radserve.report.sparse_gzip`)
    instead of to a file nibabel opens at ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    affine = volume.nifti_affine()
    # (slice, row, column) in C order is (i, j, k) in Fortran order: a view, no copy.
    image = nib.Nifti1Image(np.transpose(volume.array, (2, 1, 0)), affine)
    image.header.set_xyzt_units("mm")
    image.set_sform(affine, code="scanner")
    if _is_orthogonal(affine):
        image.set_qform(affine, code="scanner")
    else:
        image.set_qform(None, code="unknown")
    if volume.array.dtype.kind in "iu":
        image.header.set_slope_inter(1.0, 0.0)
    if label_map:
        image.header.set_intent("label")
    if fileobj is None:
        nib.save(image, str(path))
    else:
        image.to_file_map({"image": nib.FileHolder(str(path), fileobj)})
    return path


def _read_data(image: nib.Nifti1Image) -> np.ndarray:
    proxy = image.dataobj
    slope, inter = proxy.slope, proxy.inter
    raw = np.asanyarray(proxy.get_unscaled())
    if (slope, inter) == (1.0, 0.0) or (np.isnan(slope) and np.isnan(inter)):
        return raw
    if raw.dtype.kind in "iu" and float(slope).is_integer() and float(inter).is_integer():
        lo, hi = sorted((raw.min() * slope + inter, raw.max() * slope + inter))
        if lo >= _INT16.min and hi <= _INT16.max:
            return (raw.astype(np.int32) * int(slope) + int(inter)).astype(np.int16)
    return np.asarray(raw, dtype=np.float32) * np.float32(slope) + np.float32(inter)


def _is_orthogonal(affine: np.ndarray, tol: float = 1e-6) -> bool:
    axes = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    return bool(np.allclose(axes.T @ axes, np.eye(3), atol=tol))
