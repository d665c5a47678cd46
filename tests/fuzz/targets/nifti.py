"""Target (g): the bytes of one NIfTI file, through what the upload form and the job do
with it up to the loaded volume:

- the upload door (``POST /v1/studies``, field ``files``): the sniffer
  (:func:`~radserve.service.sniff.sniff`, by content), the one-NIfTI rule
  (:func:`~radserve.service.sniff.check_combination`), the priority rules' header read
  (:func:`~radserve.service.study_attributes.stream_attributes`, which tries DICOM);
- the file stored under the suffix its sniffed kind gives it (``upload.nii`` or
  ``upload.nii.gz``), as :mod:`radserve.store.files` does, and taken as a NIfTI study
  (:func:`~radserve.service.sniff.input_kind`);
- the job's (and ``radserve run``'s) :class:`~radserve.pipeline.inputs.NiftiInput`:
  :func:`~radserve.ingest.nifti.load_nifti` (declared layout, bounds, scaling, nibabel's
  read, orientation, qform/sform, the voxels inflated within the declared size, value
  checks) and the pipeline's stack rules.

A plain ``.nii`` input is also run gzip-compressed (the ``.nii.gz`` path reads its voxels
through :func:`~radserve.ingest.nifti_bounds.read_gzip_voxels`, not nibabel): mutating the
compressed bytes themselves seldom gets past the deflate stream to a header field.

Beyond :func:`~tests.fuzz.invariant.refusals_only`, a volume that loads must be usable:
finite voxels and affine, voxel sizes within the policy's spacings, no more voxels than
``max_voxels``; and a refusal must say what is wrong: a message that only names an
exception type (``"(HeaderDataError)"``) or holds a traceback is a finding."""

from __future__ import annotations

import gzip
import io
import re
import struct
import tempfile
from pathlib import Path

import nibabel as nib
import numpy as np

from radserve.errors import RadserveError
from radserve.ingest.policy import IngestPolicy
from radserve.pipeline.inputs import NiftiInput
from radserve.pipeline.spec import PipelineSpec
from radserve.progress import StageTimer
from radserve.service.sniff import FileKind, check_combination, input_kind, sniff
from radserve.service.study_attributes import stream_attributes
from tests.fuzz.invariant import refusals_only

COVERED = (
    "radserve.ingest.nifti",
    "radserve.ingest.nifti_bounds",
    "radserve.ingest.geometry",
    "radserve.ingest.ct_scale",
    "radserve.service.sniff",
    "radserve.pipeline.inputs",
    "radserve.domain.volume",
    "nibabel.nifti1",
    "nibabel.nifti2",
    "nibabel.analyze",
    "nibabel.spatialimages",
    "nibabel.arrayproxy",
    "nibabel.volumeutils",
    "nibabel.quaternions",
    "nibabel.wrapstruct",
    "nibabel.openers",
)
# bounds small enough that a fuzzed dim is refused, not allocated (8 MiB of voxels)
POLICY = IngestPolicy(max_voxels=2**21, max_file_bytes=8 << 20, max_header_bytes=1 << 20)
PIPELINE = PipelineSpec.model_validate(
    {
        "name": "fuzz",
        "version": "1.0.0",
        "series_selection": {"modalities": ["CT"], "min_slices": 2},
        "steps": [{"model": "organs"}],
    }
)
KEYWORDS = ("AccessionNumber", "StudyDescription", "Modality")
_FOLDER = Path(tempfile.mkdtemp(prefix="radserve-fuzz-nifti-"))
# a refusal that names only the exception behind it (or holds a traceback) is unclear
_UNCLEAR = re.compile(r"\(\w*(Error|Exception|Warning)\)|Traceback \(most recent")


class UnclearRefusalError(AssertionError):
    """A refusal whose message does not say what is wrong with the file."""


def _phantom(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A small CT phantom in HU: air around a water cylinder with a denser core."""
    i, j = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    disc = (i - shape[0] / 2) ** 2 + (j - shape[1] / 2) ** 2
    plane = np.where(disc < (shape[0] / 3) ** 2, 0.0, -1000.0)
    plane[disc < (shape[0] / 6) ** 2] = 60.0
    data = np.repeat(plane[:, :, None], shape[2], axis=2)
    if len(shape) == 4:
        data = np.repeat(data[..., None], shape[3], axis=3)
    return data.astype(dtype)


_AFFINE = np.array(
    [[-0.8, 0.0, 0.0, 60.0], [0.0, -0.8, 0.0, 40.0], [0.0, 0.0, 2.5, -30.0], [0, 0, 0, 1]]
)


def _image(
    data: np.ndarray,
    *,
    klass: type = nib.Nifti1Image,
    scaling: tuple[float, float] | None = None,
    sform: bool = True,
    affine: np.ndarray = _AFFINE,
) -> bytes:
    image = klass(data, affine)
    image.header.set_xyzt_units("mm")
    image.set_qform(affine, code="scanner")
    image.set_sform(affine, code="scanner" if sform else "unknown")
    if scaling is not None:
        image.header.set_slope_inter(*scaling)
    return image.to_bytes()  # type: ignore[no-any-return]


def _with_extension(raw: bytes) -> bytes:
    """A NIfTI-1 file with one comment extension (``esize`` 32) before its voxels."""
    content = b"radserve fuzz seed".ljust(24, b"\0")
    extension = struct.pack("<ii", 8 + len(content), 6) + content
    header = bytearray(raw[:348])
    header[108:112] = struct.pack("<f", 352 + len(extension))  # vox_offset
    return bytes(header) + b"\x01\0\0\0" + extension + raw[352:]


def _oblique() -> np.ndarray:
    angle = np.radians(12)
    rotation = np.array(
        [[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]]
    )
    affine = _AFFINE.copy()
    affine[:3, :3] = rotation @ _AFFINE[:3, :3]
    return affine


def seeds() -> list[bytes]:
    shape = (16, 12, 6)
    ct16 = _phantom(shape, np.int16)
    stored = ((ct16.astype(np.int32) + 1024) // 2).astype(np.int16)  # x 2 - 1024 on read
    plain = [
        _image(ct16),
        _image(_phantom(shape, np.float32)),
        _image(stored, scaling=(2.0, -1024.0)),
        _image(ct16, klass=nib.Nifti2Image),
        _image(_phantom(shape, np.float32), klass=nib.Nifti2Image, scaling=(0.5, 0.0)),
        _image(_phantom((*shape, 1), np.int16)),  # a trailing singleton 4th axis: 3-D
        _image(_phantom((*shape, 2), np.int16)),  # 4-D: refused
        _image(ct16, sform=False, affine=_oblique()),  # the qform's quaternion in use
        _with_extension(_image(ct16)),
        _image(ct16.astype(">i2")),  # big-endian
    ]
    packed = [gzip.compress(raw, compresslevel=6, mtime=0) for raw in plain[:6]]
    return plain + packed


def one_input(data: bytes) -> None:
    with refusals_only():
        _upload_and_load(data)
    if data[:2] != b"\x1f\x8b" and len(data) >= 348:
        with refusals_only():
            _upload_and_load(gzip.compress(data, compresslevel=1, mtime=0))


def _upload_and_load(data: bytes) -> None:
    """``data`` through the upload door, stored as the sniffer names it, then the job."""
    stream = io.BytesIO(data)
    kind = sniff(stream, 1, 1)
    if kind not in (FileKind.NIFTI, FileKind.NIFTI_GZ):
        return  # DICOM and zip: the instance and series targets' surfaces
    check_combination([kind])
    stream_attributes([stream], KEYWORDS)
    for old in _FOLDER.iterdir():
        old.unlink()
    path = _FOLDER / f"upload{kind.suffix}"
    path.write_bytes(data)
    assert input_kind(_FOLDER) == "nifti"
    try:
        ingested = NiftiInput(path).ingest(PIPELINE, policy=POLICY, timer=StageTimer())
    except RadserveError as exc:
        _clear(exc)
        raise
    _check_volume(ingested.loaded.volume.array, ingested.loaded.volume.affine)


def _clear(exc: RadserveError) -> None:
    if _UNCLEAR.search(exc.message):
        raise UnclearRefusalError(f"{exc.code}: {exc.message}") from exc


def _check_volume(array: np.ndarray, affine: np.ndarray) -> None:
    if array.ndim != 3 or array.size > POLICY.max_voxels:
        raise AssertionError(f"the loaded volume has shape {array.shape}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise AssertionError("the loaded volume holds NaN or infinite values")
    if not np.isfinite(affine).all():
        raise AssertionError("the loaded volume's affine is not finite")
    spacing = np.linalg.norm(affine[:3, :3], axis=0)
    largest = max(POLICY.max_pixel_spacing_mm, POLICY.max_slice_spacing_mm)
    if not ((spacing >= POLICY.min_spacing_mm) & (spacing <= largest)).all():
        raise AssertionError(f"the loaded volume's voxel size {spacing} is not sane")


__all__ = ["COVERED", "one_input", "seeds"]
