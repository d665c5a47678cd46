"""Each field of a NIfTI header, when it is unusable, is refused naming the field, before
nibabel reads the file (:mod:`radserve.ingest.nifti_fields`, :mod:`radserve.ingest.nifti_bounds`).

Found by the ``nifti`` fuzz target and its hand-written list (2026-12): nibabel raised
(``HeaderDataError``, ``ValueError``) and radserve said only "not a readable NIfTI file
(HeaderDataError)"; a NaN pixdim beside a valid sform, or a degenerate qform, escaped as
``LinAlgError`` / ``TypeError`` (an ``internal_error``); a damaged deflate stream as
``zlib.error``; and some fields were read as something else without a word: a vox_offset
of 0 took the header's bytes for voxels, a pixdim of 0 became 1 mm, a qfac of NaN became
1, an xform code of 255 became 0, a datatype too small for the voxels read half of them.
Each case is written here as the file would be, its one field changed."""

from __future__ import annotations

import gzip
import re
import struct
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from radserve.errors import StudyError
from radserve.ingest import IngestPolicy
from radserve.ingest.nifti import load_nifti

POLICY = IngestPolicy(max_header_bytes=16 * 2**20)
Edit = Callable[[nib.Nifti1Header], None]


def _phantom() -> np.ndarray:
    data = np.full((40, 36, 12), -1000, np.int16)
    data[8:30, 8:30, 2:10] = 40
    return data


def _file(klass: type = nib.Nifti1Image, data: np.ndarray | None = None) -> bytes:
    """A well-formed single-file NIfTI of the phantom, its qform and sform set."""
    affine = np.diag([-0.8, -0.8, 2.5, 1.0])
    image = klass(_phantom() if data is None else data, affine)
    image.set_qform(affine, code="scanner")
    image.set_sform(affine, code="scanner")
    return image.to_bytes()  # type: ignore[no-any-return]


def _edited(raw: bytes, edit: Edit) -> bytes:
    """``raw`` with its header changed by ``edit``, every other byte as it was."""
    size = 540 if struct.unpack("<i", raw[:4])[0] == 540 else 348
    klass = nib.Nifti2Header if size == 540 else nib.Nifti1Header
    header = klass(bytearray(raw[:size]), check=False)
    edit(header)
    return header.binaryblock + raw[size:]


def _set(**fields: object) -> Edit:
    def edit(header: nib.Nifti1Header) -> None:
        for name, value in fields.items():
            if "__" in name:  # pixdim__1=v: one item of an array field
                field, item = name.split("__")
                values = header[field].copy()
                values[int(item)] = value
                header[field] = values
            else:
                header[name] = value

    return edit


def _refused(tmp_path: Path, raw: bytes, *, gz: bool = False) -> StudyError:
    path = tmp_path / ("ct.nii.gz" if gz else "ct.nii")
    path.write_bytes(gzip.compress(raw, 1) if gz else raw)
    with pytest.raises(StudyError) as info:
        load_nifti(path, policy=POLICY, modality="CT")
    assert "Error)" not in info.value.message, info.value.message  # an exception's name
    return info.value


BOTH = pytest.mark.parametrize(
    ("klass", "gz"),
    [(nib.Nifti1Image, False), (nib.Nifti1Image, True), (nib.Nifti2Image, False)],
    ids=["nifti1", "nifti1-gz", "nifti2"],
)


@BOTH
@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_set(dim__0=-1), "dim[0] (the number of axes) is -1, not 1 to 7"),
        (_set(dim__0=8), "dim[0] (the number of axes) is 8, not 1 to 7"),
        (_set(dim__3=-1), "dim[3] is -1: an axis cannot have a negative length"),
        (_set(dim__2=0), "holds no voxels (dim[2] is 0: an axis of length 0)"),
    ],
    ids=["dim0-negative", "dim0-eight", "dim3-negative", "dim2-zero"],
)
def test_dim_family(tmp_path: Path, klass: type, gz: bool, edit: Edit, said: str) -> None:
    """dim[0] out of range failed in nibabel (for a NIfTI-2 read byte-swapped, as
    nibabel guesses the byte order from dim[0]: "declares 2306405959167115264 bytes
    before its voxel data"); a negative length as "(ValueError)"."""
    error = _refused(tmp_path, _edited(_file(klass), edit), gz=gz)
    assert error.code == "nifti_invalid" and said in error.message


@BOTH
@pytest.mark.parametrize(
    ("code", "said", "kind"),
    [
        (9999, "datatype 9999 is not a NIfTI data type code", "nifti_invalid"),
        (1, "datatype 1 (binary) is not a voxel type", "unsupported_pixel_format"),
        (1536, "datatype 1536 (float128) is not a voxel type", "unsupported_pixel_format"),
        (2048, "datatype 2048 (complex256) is not a voxel type", "unsupported_pixel_format"),
    ],
)
def test_datatype_family(
    tmp_path: Path, klass: type, gz: bool, code: int, said: str, kind: str
) -> None:
    error = _refused(tmp_path, _edited(_file(klass), _set(datatype=code)), gz=gz)
    assert error.code == kind and said in error.message


@BOTH
def test_a_datatype_smaller_than_the_voxels_is_refused_not_half_read(
    tmp_path: Path, klass: type, gz: bool
) -> None:
    """int8 declared for int16 voxels: a ``.nii`` loaded its first half as the volume."""
    error = _refused(tmp_path, _edited(_file(klass), _set(datatype=256, bitpix=8)), gz=gz)
    assert error.code == "nifti_invalid" and "beyond the" in error.message
    assert "its datatype or dim may be wrong" in error.message


def test_a_bitpix_that_contradicts_the_datatype_is_read_as_the_datatype_says(
    tmp_path: Path,
) -> None:
    (tmp_path / "ct.nii").write_bytes(_edited(_file(), _set(bitpix=32)))
    warnings: list[str] = []
    volume = load_nifti(tmp_path / "ct.nii", policy=POLICY, modality="CT", warnings=warnings)
    assert int(np.count_nonzero(volume.array == 40)) == 22 * 22 * 8
    assert any("bitpix 32 does not match its datatype 4 (int16" in w for w in warnings)


@BOTH
@pytest.mark.parametrize("offset", [0, 100, -352, float("nan"), float("inf")])
def test_vox_offset_family(tmp_path: Path, klass: type, gz: bool, offset: float) -> None:
    """0 (a ``.hdr``/``.img`` pair's) ran, the 352 header bytes read as the first voxels;
    inside the header or negative failed as "(HeaderDataError)"; NaN as "(ValueError)"."""
    if klass is nib.Nifti2Image and not np.isfinite(offset):
        pytest.skip("NIfTI-2 holds vox_offset as an integer")
    error = _refused(tmp_path, _edited(_file(klass), _set(vox_offset=offset)), gz=gz)
    assert error.code == "nifti_invalid" and f"vox_offset is {offset:g}:" in error.message


@pytest.mark.parametrize("field", ["qform_code", "sform_code"])
@pytest.mark.parametrize("code", [255, -1])
def test_an_xform_code_nifti_does_not_define_is_refused(
    tmp_path: Path, field: str, code: int
) -> None:
    """nibabel read it as 0: the other form was used, or "declares no orientation"."""
    error = _refused(tmp_path, _edited(_file(), _set(**{field: code})))
    assert error.code == "nifti_invalid"
    assert f"{field} is {code}, not a NIfTI xform code" in error.message


@BOTH
@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_set(pixdim__2=np.nan), "pixdim[2] is nan: the qform's voxel sizes must be finite"),
        (_set(pixdim__1=np.inf), "pixdim[1] is inf: the qform's voxel sizes must be finite"),
        (_set(pixdim__0=np.nan), "pixdim[0] (qfac, the qform's handedness) is nan"),
        (_set(pixdim__0=2.0), "pixdim[0] (qfac, the qform's handedness) is 2, not 1 or -1"),
        (_set(quatern_b=2.0), "qform quaternion is not a rotation"),
        (_set(quatern_c=np.nan), "qform is not finite (quatern_b is 0, quatern_c is nan"),
        (_set(qoffset_y=np.inf), "qoffset_y is inf"),
        (_set(pixdim__3=1e-300), "qform (set beside the sform) is degenerate"),
    ],
    ids=[
        "pixdim-nan",
        "pixdim-inf",
        "qfac-nan",
        "qfac-2",
        "quaternion",
        "quat-nan",
        "qoffset-inf",
        "degenerate",
    ],
)
def test_qform_family_beside_a_valid_sform(
    tmp_path: Path, klass: type, gz: bool, edit: Edit, said: str
) -> None:
    """A NaN pixdim was an internal_error (``LinAlgError`` comparing the qform with the
    sform), a degenerate qform a ``TypeError`` (the fuzzer's first finding); a NaN qfac
    was read as 1; a quaternion past unit length failed as "(ValueError)"."""
    if klass is nib.Nifti1Image and said.startswith("qform (set"):
        edit = _set(pixdim__3=1e-30)  # float32
    error = _refused(tmp_path, _edited(_file(klass), edit), gz=gz)
    assert error.code in ("nifti_invalid", "geometry_invalid") and said in error.message


@pytest.mark.parametrize("axis", [1, 2, 3])
def test_a_zero_pixdim_is_refused_where_the_qform_is_the_orientation(
    tmp_path: Path, axis: int
) -> None:
    """nibabel read it as 1 mm: a voxel size the file does not hold."""
    raw = _edited(_file(), _set(sform_code=0, **{f"pixdim__{axis}": 0.0}))
    error = _refused(tmp_path, raw)
    assert error.code == "nifti_invalid"
    assert f"pixdim[{axis}] is 0 and the qform is the orientation" in error.message


@pytest.mark.parametrize("row", ["srow_x", "srow_y", "srow_z"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_an_sform_row_that_is_not_finite_is_named(tmp_path: Path, row: str, value: float) -> None:
    error = _refused(tmp_path, _edited(_file(), _set(**{row: [value] * 4})))
    assert error.code == "nifti_invalid" and f"{row} is ({value:g}, " in error.message


def _with_extension(raw: bytes, esize: int, ecode: int = 6, room: int = 16) -> bytes:
    """``raw`` (NIfTI-1) with its extension flag set and one extension head declaring
    ``esize`` in ``room`` bytes before the voxels."""
    head = struct.pack("<ii", esize, ecode).ljust(room, b"\0")
    header = _edited(raw, _set(vox_offset=352 + room))
    return header[:348] + b"\x01\0\0\0" + head + raw[352:]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("esize", [0, -8, 4, 7, 1000, 2**31 - 1])
def test_an_extension_whose_size_does_not_fit_is_named(
    tmp_path: Path, gz: bool, esize: int
) -> None:
    """nibabel failed as "(ValueError)" or "(HeaderDataError)"."""
    error = _refused(tmp_path, _with_extension(_file(), esize), gz=gz)
    assert error.code == "nifti_invalid"
    assert f"extension 1 (at byte 352, ecode 6) declares esize {esize}:" in error.message


def test_a_header_of_countless_extensions_is_refused_after_the_most_a_file_holds(
    tmp_path: Path,
) -> None:
    """262,144 extensions of 16 bytes (a 30 KB .nii.gz, 4 MiB before vox_offset):
    nibabel made an object of each (4 million, at ``max_header_bytes``, took ~22 CPU-s
    and ~1.2 GB); the walk stops after ``nifti_bounds.MAX_EXTENSIONS``."""
    count = 2**18
    raw = _file()
    header = _edited(raw, _set(vox_offset=352 + 16 * count))
    extensions = (struct.pack("<ii", 16, 6) + bytes(8)) * count
    content = header[:348] + b"\x01\0\0\0" + extensions + raw[352:]
    error = _refused(tmp_path, content, gz=True)
    assert error.code == "nifti_invalid"
    assert re.search(r"holds more than \d+ extensions before vox_offset", error.message)


def test_well_formed_extensions_load_without_being_held(tmp_path: Path) -> None:
    """An 8 MiB extension (under ``max_header_bytes``) in a ``.nii.gz``: nibabel held it
    in memory to load the file; it is now inflated and dropped as the voxels are read."""
    size = 8 * 2**20
    raw = _file()
    header = _edited(raw, _set(vox_offset=352 + size))
    extension = struct.pack("<ii", size, 40) + bytes(size - 8)
    (tmp_path / "ct.nii.gz").write_bytes(
        gzip.compress(header[:348] + b"\x01\0\0\0" + extension + raw[352:], 1)
    )
    tracemalloc.start()
    try:
        volume = load_nifti(tmp_path / "ct.nii.gz", policy=POLICY, modality="CT")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert int(np.count_nonzero(volume.array == 40)) == 22 * 22 * 8
    assert peak < 2 * 2**20, peak  # the voxels are 34 KB; the extension 8 MiB


@pytest.mark.parametrize(
    ("scaling", "said"),
    [((1e38, 0.0), "scl_slope 1e+38, scl_inter 0"), ((1e37, 1e38), "scl_slope 1e+37")],
)
def test_a_scaling_past_float32_is_named(
    tmp_path: Path, scaling: tuple[float, float], said: str
) -> None:
    """It made infinite voxels, refused as "N voxels are not finite numbers"."""
    raw = _edited(_file(), _set(scl_slope=scaling[0], scl_inter=scaling[1]))
    error = _refused(tmp_path, raw)
    assert error.code == "implausible_pixel_values"
    assert "beyond what a 32-bit float holds" in error.message and said in error.message


def test_float64_voxels_past_float32_are_refused_for_any_modality(tmp_path: Path) -> None:
    """An MR volume (no CT scale) of float64 1e300 loaded: finite here, infinite where a
    model reads float32."""
    data = _phantom().astype(np.float64)
    data[3, 4, 5] = 1e300
    (tmp_path / "mr.nii").write_bytes(_file(data=data))
    with pytest.raises(StudyError, match=r"1 of 17280 NIfTI voxels lie beyond what a 32-bit"):
        load_nifti(tmp_path / "mr.nii", policy=POLICY, modality="MR")
    data[3, 4, 5] = 1e30  # past any CT scale, within float32: an MR volume may hold it
    (tmp_path / "mr.nii").write_bytes(_file(data=data))
    assert load_nifti(tmp_path / "mr.nii", policy=POLICY, modality="MR").array.max() == 1e30


def _damaged_deflate(raw: bytes) -> bytes:
    """A gzip member whose deflate stream is damaged inside the header's bytes (a
    distance that points before the stream's start): ``zlib.error``, not ``OSError``."""
    packed = bytearray(gzip.compress(raw, 6))
    for at in range(10, 40):
        trial = bytearray(packed)
        trial[at] ^= 0x5A
        try:
            zlib.decompress(bytes(trial), 31)
        except zlib.error as exc:
            if "distance" in str(exc) or "invalid" in str(exc):
                return bytes(trial)
    raise AssertionError("no damaging byte found")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (lambda: gzip.compress(bytes(1000)), "sizeof_hdr) read 0, not 348"),
        (lambda: gzip.compress(b""), "holds 0 bytes, fewer than a NIfTI-1 header's 348"),
        (lambda: _damaged_deflate(_file()), "the NIfTI file's gzip stream is"),
    ],
    ids=["not-nifti", "empty", "damaged-deflate"],
)
def test_a_gzip_that_holds_no_usable_nifti_is_named(
    tmp_path: Path, content: Callable[[], bytes], said: str
) -> None:
    """The sniffer takes any gzip for a ``.nii.gz``: these failed as "not a readable
    NIfTI file (ImageFileError)", and a damaged deflate stream escaped as ``zlib.error``
    (the fuzzer's second finding)."""
    (tmp_path / "ct.nii.gz").write_bytes(content())
    with pytest.raises(StudyError) as info:
        load_nifti(tmp_path / "ct.nii.gz", policy=POLICY, modality="CT")
    assert info.value.code == "nifti_invalid" and said in info.value.message


def test_a_file_is_read_by_its_content_whatever_its_name(tmp_path: Path) -> None:
    """``radserve run`` names the file as its user did: a gzip named ``.nii`` and a plain
    file named ``.nii.gz`` failed as "not a readable NIfTI file"."""
    raw = _file()
    (tmp_path / "gz.nii").write_bytes(gzip.compress(raw))
    (tmp_path / "plain.nii.gz").write_bytes(raw)
    for name in ("gz.nii", "plain.nii.gz"):
        volume = load_nifti(tmp_path / name, policy=POLICY, modality="CT")
        assert int(np.count_nonzero(volume.array == 40)) == 22 * 22 * 8


def test_a_gzip_bomb_stops_at_the_declared_size(tmp_path: Path) -> None:
    """A 2.3 MB ``.nii.gz`` whose stream inflates to 512 MiB past its 34 KB of voxels:
    refused after the declared bytes and one more, holding no more than those."""
    stream = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts = [stream.compress(_file())]
    parts += [stream.compress(bytes(2**20)) for _ in range(512)]
    (tmp_path / "bomb.nii.gz").write_bytes(b"".join([*parts, stream.flush()]))
    assert (tmp_path / "bomb.nii.gz").stat().st_size < 4 * 2**20
    tracemalloc.start()
    try:
        with pytest.raises(StudyError, match="gzip stream inflates beyond the 34912 bytes"):
            load_nifti(tmp_path / "bomb.nii.gz", policy=POLICY, modality="CT")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, peak  # the voxels' 34 KB and gzip's buffers
