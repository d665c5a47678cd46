"""A NIfTI file's declared sizes, read before nibabel reads anything more, and its voxel
data inflated within what it declares.

A ``.nii.gz`` costs its sender the compressed bytes and radserve the inflated ones:
before 2026-12-06 (evening), ``nibabel.load`` inflated every header extension (``vox_offset``
bytes) before radserve saw a size (a 2.7 MB upload with a 600 MB extension held 700 MB
for 6 s, then failed), and the voxel data was inflated through nibabel, which stops at
the declared size but says nothing of a stream that goes on. Here:

* :func:`declared_layout` inflates only the fixed header (348 or 540 bytes) and gives
  the declared shape, voxel type and data offset, so the bounds (``ingest.max_voxels``,
  ``max_file_bytes``, and ``max_header_bytes`` for what precedes the voxels) are
  checked before anything else is inflated;
* :func:`read_gzip_voxels` inflates exactly the declared voxel bytes into the array
  that keeps them (no second copy) and refuses a stream that holds fewer, or more: a
  file whose stream inflates beyond what its header declares is not the file it says.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np

from radserve.errors import StudyError

_GZIP_MAGIC = b"\x1f\x8b"
_INVALID = "nifti_invalid"
_HEADERS = {348: nib.Nifti1Header, 540: nib.Nifti2Header}
_CHUNK = 16 * 2**20  # bytes inflated per read of the voxel data


@dataclass(frozen=True)
class DeclaredLayout:
    """What a NIfTI header declares about the data that follows it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # bytes before the voxel data: the header and its extensions
    scaling: tuple[float, float] = (0.0, 0.0)  # scl_slope and scl_inter as stored

    @property
    def voxels(self) -> int:
        return int(np.prod(self.shape, dtype=object)) if self.shape else 0

    @property
    def data_bytes(self) -> int:
        return self.voxels * self.dtype.itemsize


def is_gzip(path: Path | str) -> bool:
    with open(path, "rb") as raw:
        return raw.read(2) == _GZIP_MAGIC


def declared_layout(path: Path | str) -> DeclaredLayout | None:
    """The header's declared layout, inflating only the header; None when the first
    bytes are not a NIfTI-1/2 header (nibabel then says what the file is not)."""
    try:
        opener = gzip.open if is_gzip(path) else open
        with opener(path, "rb") as stream:
            block = stream.read(540)
    except (OSError, EOFError):  # missing, unreadable or a damaged gzip stream: nibabel
        return None  # says so, as the caller's StudyError
    for size, klass in _HEADERS.items():
        for order in ("<", ">"):
            if len(block) >= size and struct.unpack(f"{order}i", block[:4])[0] == size:
                try:
                    header = klass(block[:size], check=False)
                    return DeclaredLayout(
                        tuple(int(n) for n in header.get_data_shape()),
                        header.get_data_dtype(),
                        int(header.get_data_offset()),
                        (float(header["scl_slope"]), float(header["scl_inter"])),
                    )
                except Exception:  # a header nibabel cannot even lay out: it says why
                    return None
    return None


def read_gzip_voxels(path: Path | str, layout: DeclaredLayout) -> np.ndarray:
    """The unscaled voxel array (Fortran order, the declared shape) of a ``.nii.gz``,
    inflated in chunks straight into its buffer; refuses (``nifti_invalid``) a stream
    that ends before the declared bytes or goes on after them."""
    data = np.empty(layout.data_bytes, np.uint8)
    view = memoryview(data)
    got, cut, more = 0, False, False
    with gzip.open(path, "rb") as stream:
        try:
            stream.seek(layout.offset)  # inflates and drops what precedes the voxels
            while got < layout.data_bytes:
                n = stream.readinto(view[got : got + _CHUNK])
                if not n:
                    break
                got += n
            more = got == layout.data_bytes and bool(stream.read(1))
        except EOFError:  # the deflate stream stops before its end marker (and checksum)
            cut = True
        except gzip.BadGzipFile as exc:
            # gzip reads on past a stream's end for the next member: bytes that are no
            # gzip member (and not the zeros gzip allows as padding) follow it
            raise StudyError(
                "the NIfTI file's gzip stream is followed by bytes that are not gzip, or is "
                "damaged: refused, as a file that is not what its header says (re-export it)",
                code=_INVALID,
            ) from exc
        if cut:
            raise StudyError(
                "the NIfTI file's gzip stream is cut short (it ends without its end marker; "
                f"its header declares {layout.data_bytes} bytes of {_shape(layout)} voxels): "
                "a truncated file",
                code=_INVALID,
            )
        if got < layout.data_bytes:
            raise StudyError(
                f"the NIfTI file's compressed voxel data ends after {got} bytes, short of the "
                f"{layout.data_bytes} its header declares ({_shape(layout)}): a truncated "
                "file",
                code=_INVALID,
            )
        if more:
            raise StudyError(
                "the NIfTI file's gzip stream inflates beyond the "
                f"{layout.offset + layout.data_bytes} bytes its header declares (header "
                f"and {_shape(layout)} voxels): refused, as a file that is not what its "
                "header says (re-export it)",
                code=_INVALID,
            )
    return np.ndarray(layout.shape, layout.dtype, buffer=data, order="F")


def _shape(layout: DeclaredLayout) -> str:
    return f"{' x '.join(map(str, layout.shape))} {layout.dtype}"


__all__ = ["DeclaredLayout", "declared_layout", "is_gzip", "read_gzip_voxels"]
