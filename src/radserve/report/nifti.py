"""Label maps (and images) as NIfTI-1 files that open aligned in any NIfTI viewer.

The array is stored transposed to NIfTI (i, j, k) = (column, row, slice) with
``Volume.nifti_affine()`` (RAS) as both sform and qform, so the file lands on the
input exactly; :func:`read_nifti` inverts it (``Volume.from_nifti_arrays``).
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path
from typing import IO

import numpy as np

from radserve import durable
from radserve.domain import Volume
from radserve.errors import ReportError, StudyError
from radserve.ingest.nifti import load_nifti, save_nifti
from radserve.report.sparse_gzip import LEVEL, SparseGzipWriter

logger = logging.getLogger(__name__)

_SCANNER = 1  # NIfTI xform code "scanner anatomical"


def write_nifti(volume: Volume, path: Path, *, label_map: bool = False) -> Path:
    """Write ``volume`` (any dtype nibabel supports) to ``path`` (.nii or .nii.gz).

    The file is written through :func:`radserve.durable.write_with` (a temporary named
    by its writer, fsynced, renamed, the folder fsynced, or left to the enclosing
    :func:`radserve.durable.batch`): a crash mid-write leaves no torn map under ``path``,
    which a reader would take for the job's result. A ``.nii.gz`` label map goes through
    :class:`SparseGzipWriter`, which skips compressing the map's all-zero stretches (most
    of it); other ``.nii.gz`` images through :mod:`gzip` at the same level: the same
    bytes when read.
    """
    path = Path(path)

    def write(handle: IO[bytes]) -> None:
        if not path.name.endswith(".gz"):
            save_nifti(volume, path, label_map=label_map, fileobj=handle)
        elif label_map:
            with SparseGzipWriter(handle) as sparse:
                save_nifti(volume, path, label_map=True, fileobj=sparse)
        else:
            with gzip.GzipFile(fileobj=handle, mode="wb", compresslevel=LEVEL, mtime=0) as out:
                save_nifti(volume, path, fileobj=out)

    try:
        return durable.write_with(path, write)
    except OSError as exc:
        raise ReportError(f"cannot write NIfTI {path}: {exc}") from exc


def write_label_map(labels: Volume, path: Path) -> Path:
    """A label map as uint8 (values <= 255) or uint16; refuses non-integer data."""
    array = labels.array
    if not np.issubdtype(array.dtype, np.integer):
        raise ReportError(f"a label map must hold integers, got {array.dtype}")
    top = int(array.max()) if array.size else 0
    if array.min(initial=0) < 0 or top > np.iinfo(np.uint16).max:
        raise ReportError(f"label values must lie in 0..65535, got max {top}")
    dtype = np.uint8 if top <= 255 else np.uint16
    return write_nifti(labels.with_array(array.astype(dtype, copy=False)), path, label_map=True)


def read_nifti(path: Path) -> Volume:
    """Read a NIfTI written by :func:`write_nifti` (or any 3-D NIfTI) back into a Volume."""
    try:
        return load_nifti(path)
    except StudyError as exc:
        raise ReportError(f"cannot read NIfTI {path}: {exc.message}") from exc
