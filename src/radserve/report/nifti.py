"""Label maps (and images) as NIfTI-1 files that open aligned in any NIfTI viewer.

The array is stored transposed to NIfTI (i, j, k) = (column, row, slice) with
``Volume.nifti_affine()`` (RAS) as both sform and qform, so the file lands on the
input exactly; :func:`read_nifti` inverts it (``Volume.from_nifti_arrays``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import nibabel as nib
import numpy as np

from radserve.domain import Volume
from radserve.errors import ReportError

logger = logging.getLogger(__name__)

_SCANNER = 1  # NIfTI xform code "scanner anatomical"


def write_nifti(volume: Volume, path: Path) -> Path:
    """Write ``volume`` (any dtype nibabel supports) to ``path`` (.nii or .nii.gz)."""
    # (slice, row, column) in C order is (i, j, k) in Fortran order: a view, no copy.
    data = np.transpose(volume.array, (2, 1, 0))
    affine = volume.nifti_affine()
    image = nib.Nifti1Image(data, affine)
    image.set_sform(affine, code=_SCANNER)
    image.set_qform(affine, code=_SCANNER)
    image.header.set_xyzt_units(xyz="mm")
    if np.issubdtype(data.dtype, np.integer):
        image.header["intent_code"] = 1002  # NIFTI_INTENT_LABEL
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        nib.save(image, path)
    except OSError as exc:
        raise ReportError(f"cannot write NIfTI {path}: {exc}") from exc
    logger.debug("NIfTI written: shape %s", volume.shape)
    return path


def write_label_map(labels: Volume, path: Path) -> Path:
    """A label map as uint8 (values <= 255) or uint16; refuses non-integer data."""
    array = labels.array
    if not np.issubdtype(array.dtype, np.integer):
        raise ReportError(f"a label map must hold integers, got {array.dtype}")
    top = int(array.max()) if array.size else 0
    if array.min(initial=0) < 0 or top > np.iinfo(np.uint16).max:
        raise ReportError(f"label values must lie in 0..65535, got max {top}")
    dtype = np.uint8 if top <= 255 else np.uint16
    return write_nifti(labels.with_array(array.astype(dtype, copy=False)), path)


def read_nifti(path: Path) -> Volume:
    """Read a NIfTI written by :func:`write_nifti` (or any 3-D NIfTI) back into a Volume."""
    try:
        image = nib.load(Path(path))
        data = np.asanyarray(image.dataobj)
    except (OSError, nib.filebasedimages.ImageFileError) as exc:
        raise ReportError(f"cannot read NIfTI {path}: {exc}") from exc
    if data.ndim != 3:
        raise ReportError(f"expected a 3-D NIfTI, got shape {data.shape}")
    return Volume.from_nifti_arrays(data, image.affine)
