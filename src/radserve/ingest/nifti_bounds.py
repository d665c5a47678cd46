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

Since the 2026-12 fuzzing of the NIfTI door, both go for a ``.nii`` too, and nibabel
reads neither the voxels nor the extensions: :func:`declared_layout` opens a file by
its content (gzip or not, whatever its name) and refuses, naming the field, a header
:mod:`radserve.ingest.nifti_fields` finds unusable, a damaged gzip stream
(a ``zlib.error`` had escaped as such) or a file that is no NIfTI; :func:`read_voxels`
walks the extensions (an ``esize`` that does not fit is named) and reads exactly the
declared voxels, refusing a file that holds more (a ``.nii`` whose datatype said int8
for int16 voxels had loaded half its bytes as a volume).
"""

from __future__ import annotations

import contextlib
import gzip
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import nibabel as nib
import numpy as np

from radserve.errors import StudyError
from radserve.ingest.nifti_fields import check_data_fields, header_end

_GZIP_MAGIC = b"\x1f\x8b"
_INVALID = "nifti_invalid"
_HEADERS = {348: nib.Nifti1Header, 540: nib.Nifti2Header}
_CHUNK = 16 * 2**20  # bytes inflated per read of the voxel data
# header extensions walked at most: real files hold a handful (AFNI, DICOM, JSON, CIFTI);
# 4 million 16-byte ones (a 0.4 MB .nii.gz, within ingest.max_header_bytes) took nibabel
# ~22 CPU-s and ~1.2 GB to load, and this walk ~4 CPU-s
MAX_EXTENSIONS = 4096
# what the gzip module raises on a damaged stream: BadGzipFile for a bad member header,
# CRC or length, zlib.error for a damaged deflate stream, EOFError for one that ends
# before its end marker
_GZIP_DAMAGE = (gzip.BadGzipFile, zlib.error, EOFError)


@dataclass(frozen=True)
class DeclaredLayout:
    """What a NIfTI header declares about the data that follows it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # bytes before the voxel data: the header and its extensions
    scaling: tuple[float, float] = (0.0, 0.0)  # scl_slope and scl_inter as stored
    header: nib.Nifti1Header | None = field(default=None, compare=False)  # as stored
    notes: tuple[str, ...] = ()  # what the header holds that was tolerated, in words
    compressed: bool = False  # a gzip stream (.nii.gz), by content

    @property
    def voxels(self) -> int:
        return int(np.prod(self.shape, dtype=object)) if self.shape else 0

    @property
    def data_bytes(self) -> int:
        return self.voxels * self.dtype.itemsize


def is_gzip(path: Path | str) -> bool:
    with open(path, "rb") as raw:
        return raw.read(2) == _GZIP_MAGIC


@contextlib.contextmanager
def open_nifti(path: Path | str, compressed: bool) -> Iterator[BinaryIO]:
    """The file's bytes, inflated when ``compressed``."""
    with open(path, "rb") as raw:
        if not compressed:
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield stream  # type: ignore[misc]


def declared_layout(path: Path | str) -> DeclaredLayout:
    """The header's declared layout, inflating only the header, the fields it follows
    from checked (:func:`~radserve.ingest.nifti_fields.check_data_fields`); refuses
    (naming what is wrong) a file that holds no usable NIfTI-1/2 header."""
    compressed = is_gzip(path)
    try:
        with open_nifti(path, compressed) as stream:
            block = stream.read(540)
    except _GZIP_DAMAGE as exc:
        raise StudyError(
            f"the NIfTI file's gzip stream is damaged before the end of its header "
            f"({_damage(exc)}): re-export the file",
            code=_INVALID,
        ) from exc
    header = _header(block, compressed)
    notes = check_data_fields(header)
    stored = float(header["vox_offset"])  # NaN or inf: refused by the field checks
    offset = int(stored) if math.isfinite(stored) else 0
    return DeclaredLayout(
        tuple(int(n) for n in header.get_data_shape()),
        header.get_data_dtype(),
        offset,
        (float(header["scl_slope"]), float(header["scl_inter"])),
        header,
        notes,
        compressed,
    )


def _header(block: bytes, compressed: bool) -> nib.Nifti1Header:
    """The header ``block`` starts, read in the byte order its sizeof_hdr gives (nibabel
    guesses it from dim[0], so a damaged dim[0] read every field byte-swapped)."""
    what = "not a readable NIfTI file: " + ("its inflated gzip stream" if compressed else "it")
    if len(block) < 348:
        raise StudyError(
            f"{what} holds {len(block)} bytes, fewer than a NIfTI-1 header's 348 (or a "
            "truncated file)",
            code=_INVALID,
        )
    for size, klass in _HEADERS.items():
        for order in ("<", ">"):
            if struct.unpack(f"{order}i", block[:4])[0] != size:
                continue
            if len(block) < size:
                raise StudyError(
                    f"{what} holds {len(block)} bytes, fewer than the NIfTI-2 header's "
                    f"{size} its sizeof_hdr declares: a truncated file",
                    code=_INVALID,
                )
            return klass(block[:size], endianness=order, check=False)
    first = struct.unpack("<i", block[:4])[0]
    raise StudyError(
        f"{what} does not start with a NIfTI header: its first 4 bytes (sizeof_hdr) read "
        f"{first}, not 348 (NIfTI-1) or 540 (NIfTI-2), in either byte order",
        code=_INVALID,
    )


def read_voxels(path: Path | str, layout: DeclaredLayout) -> np.ndarray:
    """The unscaled voxel array (Fortran order, the declared shape), read (inflated, for
    a ``.nii.gz``, in chunks) straight into its buffer once the extensions are walked
    (:func:`_walk_extensions`); refuses (``nifti_invalid``) a file that ends before the
    declared bytes or goes on after them."""
    data = np.empty(layout.data_bytes, np.uint8)
    view = memoryview(data)
    got, more = 0, False
    try:
        with open_nifti(path, layout.compressed) as stream:
            _walk_extensions(stream, layout)
            stream.seek(layout.offset)  # inflates and drops what precedes the voxels
            while got < layout.data_bytes:
                n = stream.readinto(view[got : got + _CHUNK])
                if not n:
                    break
                got += n
            more = got == layout.data_bytes and bool(stream.read(1))
    except EOFError as exc:  # the deflate stream stops before its end marker (and checksum)
        raise StudyError(
            "the NIfTI file's gzip stream is cut short (it ends without its end marker; "
            f"its header declares {layout.data_bytes} bytes of {_shape(layout)} voxels): "
            "a truncated file",
            code=_INVALID,
        ) from exc
    except (gzip.BadGzipFile, zlib.error) as exc:
        # gzip reads on past a stream's end for the next member: bytes that are no
        # gzip member (and not the zeros gzip allows as padding) follow it
        raise StudyError(
            "the NIfTI file's gzip stream is followed by bytes that are not gzip, or is "
            f"damaged ({_damage(exc)}): refused, as a file that is not what its header "
            "says (re-export it)",
            code=_INVALID,
        ) from exc
    if got < layout.data_bytes and layout.compressed:
        raise StudyError(
            f"the NIfTI file's compressed voxel data ends after {got} bytes, short of the "
            f"{layout.data_bytes} its header declares ({_shape(layout)} from vox_offset "
            f"{layout.offset}): a truncated file",
            code=_INVALID,
        )
    if got < layout.data_bytes:
        raise StudyError(
            f"the NIfTI file holds {Path(path).stat().st_size} bytes, short of the "
            f"{layout.offset + layout.data_bytes} its header declares (header and "
            f"{_shape(layout)} voxels): a truncated file",
            code=_INVALID,
        )
    if more:
        goes_on = "file's gzip stream inflates" if layout.compressed else "file goes on"
        raise StudyError(
            f"the NIfTI {goes_on} beyond the "
            f"{layout.offset + layout.data_bytes} bytes its header declares (header "
            f"and {_shape(layout)} voxels): refused, as a file that is not what its "
            "header says (its datatype or dim may be wrong; re-export it)",
            code=_INVALID,
        )
    return np.ndarray(layout.shape, layout.dtype, buffer=data, order="F")


def _walk_extensions(stream: BinaryIO, layout: DeclaredLayout) -> None:
    """The header extensions between the header and vox_offset, where the extension
    flag says there are some: each ``esize`` (its 8-byte head included) must be at
    least 8 and end by vox_offset (nibabel stopped with "failed to read extension
    content", or a ValueError, and radserve said only the exception's type). Their
    content is skipped: radserve reads nothing from it. More than
    :data:`MAX_EXTENSIONS` are refused: nibabel held each as an object."""
    assert layout.header is not None
    start = header_end(layout.header)
    stream.seek(start - 4)
    flag = stream.read(4)
    if len(flag) < 4 or flag[0] == 0:
        return
    order = layout.header.endianness
    position, number = start, 1
    while layout.offset - position >= 16:  # nibabel's rule: a smaller rest is padding
        if number > MAX_EXTENSIONS:
            raise StudyError(
                f"the NIfTI header holds more than {MAX_EXTENSIONS} extensions before "
                f"vox_offset {layout.offset} (extension {number} at byte {position}): not "
                "a header radserve reads (files hold a handful); re-export the file "
                "without them",
                code=_INVALID,
            )
        head = stream.read(8)
        if len(head) < 8:
            return  # the file ends here: the voxel read says it is truncated
        esize, ecode = struct.unpack(f"{order}ii", head)
        if esize < 8 or position + esize > layout.offset:
            raise StudyError(
                f"the NIfTI header's extension {number} (at byte {position}, ecode {ecode}) "
                f"declares esize {esize}: an extension's size, its 8-byte esize and ecode "
                f"included, is at least 8 (a multiple of 16 by the standard), and the "
                f"extensions end by vox_offset {layout.offset}",
                code=_INVALID,
            )
        stream.seek(position + esize)
        position += esize
        number += 1


def _damage(exc: BaseException) -> str:
    """What the gzip module said of a damaged stream, without the exception's type."""
    if isinstance(exc, EOFError):
        return "it ends before its end marker"
    text = str(exc).strip() or "damaged"
    return f"zlib: {text}" if isinstance(exc, zlib.error) else text


def _shape(layout: DeclaredLayout) -> str:
    return f"{' x '.join(map(str, layout.shape))} {layout.dtype}"


__all__ = [
    "MAX_EXTENSIONS",
    "DeclaredLayout",
    "declared_layout",
    "is_gzip",
    "open_nifti",
    "read_voxels",
]
