"""The fields of a NIfTI-1/2 header, checked one by one before anything else is read,
each refusal naming the field, its value and what it must be.

nibabel reads a damaged header in one of three ways: it raises (``HeaderDataError``,
``ValueError``, and on a NaN pixdim a ``LinAlgError`` from radserve's own qform check),
which radserve showed as "not a readable NIfTI file (HeaderDataError)"; it "fixes" a
field silently (a pixdim of 0 read as 1 mm, a qform_code of 255 read as 0, a qfac of NaN
read as 1); or it reads the file as it stands (a vox_offset of 0 in a ``.nii`` took the
348-byte header for the first voxels). The 2026-12 fuzzing of the NIfTI door found all
three; here each such field is refused, or, where every reader agrees on what it means,
noted (a bitpix that contradicts the datatype: the datatype rules, as in nibabel, ITK and
nifti_clib).

What is checked, in order: magic; dim (the axes' count and lengths); datatype (a type
radserve reads as intensities) and bitpix; vox_offset; the qform and sform codes; the
qform's fields where its code is set (pixdim finite, qfac, the quaternion, the offsets);
the sform's rows where its code is set; last, nibabel's own checks, so that what nibabel
would refuse is refused here, in its words.
"""

from __future__ import annotations

import logging
import math

import nibabel as nib
import numpy as np
from nibabel.nifti1 import data_type_codes, xform_codes
from nibabel.quaternions import fillpositive

from radserve.errors import StudyError

_INVALID = "nifti_invalid"
_UNSUPPORTED = "unsupported_pixel_format"
# the voxel types an intensity volume is read from (datatype code: name)
INTENSITY_TYPES = {
    2: "uint8",
    4: "int16",
    8: "int32",
    16: "float32",
    64: "float64",
    256: "int8",
    512: "uint16",
    768: "uint32",
    1024: "int64",
    1280: "uint64",
}
_QUIET = logging.getLogger("radserve.ingest.nifti_fields.nibabel")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False
_NIBABEL_ERROR = 40  # nibabel's imageglobals.error_level: what its load refuses


def header_end(header: nib.Nifti1Header) -> int:
    """Where a single file's extensions (or voxels) may start: after the fixed header
    and the 4-byte extension flag (352 for NIfTI-1, 544 for NIfTI-2)."""
    return int(header.single_vox_offset)


def check_data_fields(header: nib.Nifti1Header) -> tuple[str, ...]:
    """The fields the size of the voxel data follows from (magic, dim, datatype, bitpix):
    refuse (:class:`StudyError`) a header any of which is unusable; return what was
    tolerated, in words. ``header``: read with its byte order and unchecked (nibabel's
    ``check=False``), so every field is as the file holds it."""
    _check_magic(header)
    _check_dims(header)
    return _check_datatype(header)


def check_placement_fields(header: nib.Nifti1Header) -> nib.Nifti1Header:
    """The fields that place the voxels, in the file (vox_offset) and in the patient
    (the qform and sform), then nibabel's own checks; after the declared sizes met the
    ingest bounds, so a header that claims too much is refused for that first. Returns
    the header as nibabel's load reads it: a copy, its fixes applied (|pixdim|, a qfac
    of 0 as 1), which nibabel logs and radserve does not (the checks here said what
    matters)."""
    _check_offset(header)
    _check_codes(header)
    if int(header["qform_code"]) != 0:
        _check_qform(header)
    if int(header["sform_code"]) != 0:
        _check_sform(header)
    return _as_nibabel_reads(header)


def _refuse(message: str, code: str = _INVALID) -> StudyError:
    return StudyError(f"the NIfTI header's {message}", code=code)


def _check_magic(header: nib.Nifti1Header) -> None:
    magic = bytes(header["magic"].item())
    allowed = (header.single_magic, header.pair_magic)
    if magic not in allowed:
        shown = " or ".join(repr(m.decode("latin-1")) for m in allowed)
        raise _refuse(f"magic is {magic!r}, not {shown}: not a NIfTI file, or a damaged one")


def _check_dims(header: nib.Nifti1Header) -> None:
    """dim[0] out of 1..7 failed in nibabel ("HeaderDataError"); a negative length as
    "voxel data could not be read (ValueError)"; dim[3] = 0 was read as a volume of no
    slices, and the report's overview indexed a slice that is not there
    (``internal_error`` on the server, a traceback in ``radserve run``)."""
    dim = [int(n) for n in header["dim"]]
    if not 1 <= dim[0] <= 7:
        raise _refuse(f"dim[0] (the number of axes) is {dim[0]}, not 1 to 7")
    for axis in range(1, dim[0] + 1):
        if dim[axis] == 0:
            raise StudyError(
                f"NIfTI image holds no voxels (dim[{axis}] is 0: an axis of length 0)",
                code=_INVALID,
            )
        if dim[axis] < 0:
            raise _refuse(f"dim[{axis}] is {dim[axis]}: an axis cannot have a negative length")


def _check_datatype(header: nib.Nifti1Header) -> tuple[str, ...]:
    code = int(header["datatype"])
    if code not in data_type_codes.code:
        raise _refuse(f"datatype {code} is not a NIfTI data type code")
    if code not in INTENSITY_TYPES:
        raise _refuse(
            f"datatype {code} ({data_type_codes.label[code]}) is not a voxel type radserve "
            f"reads as intensities (one of {', '.join(sorted(set(INTENSITY_TYPES.values())))}): "
            "RGB, complex, binary and 128-bit data cannot form an intensity volume",
            _UNSUPPORTED,
        )
    bits = np.dtype(INTENSITY_TYPES[code]).itemsize * 8
    bitpix = int(header["bitpix"])
    if bitpix == bits:
        return ()
    return (
        f"the NIfTI header's bitpix {bitpix} does not match its datatype {code} "
        f"({INTENSITY_TYPES[code]}, {bits} bits per voxel); the voxels were read as the "
        "datatype says",
    )


def _check_offset(header: nib.Nifti1Header) -> None:
    offset = float(header["vox_offset"])
    end = header_end(header)
    if not math.isfinite(offset) or offset < end:
        raise _refuse(
            f"vox_offset is {offset:g}: the voxels of a single-file NIfTI (.nii) start "
            f"after its {end - 4}-byte header and 4-byte extension flag, at byte {end} or "
            "later (0 is for a .hdr/.img pair, whose .img is not here)"
        )


def _check_codes(header: nib.Nifti1Header) -> None:
    for field in ("qform_code", "sform_code"):
        code = int(header[field])
        if code not in xform_codes.code:
            known = sorted(c for c in xform_codes.value_set() if isinstance(c, int))
            raise _refuse(
                f"{field} is {code}, not a NIfTI xform code ({known[0]} to {known[-1]}): which "
                "space the affine maps to is unknown"
            )


def _check_qform(header: nib.Nifti1Header) -> None:
    """The qform's fields, where its code says it is meant: nibabel reads a NaN pixdim
    or quaternion into a NaN affine, and a qfac it does not know as 1."""
    pixdim = [float(v) for v in header["pixdim"][:4]]
    bad = [f"pixdim[{i}] is {pixdim[i]:g}" for i in (1, 2, 3) if not math.isfinite(pixdim[i])]
    if bad:
        raise _refuse(f"{', '.join(bad)}: the qform's voxel sizes must be finite numbers")
    if int(header["sform_code"]) == 0:
        zero = [f"pixdim[{i}]" for i in (1, 2, 3) if pixdim[i] == 0]
        if zero:
            raise _refuse(
                f"{', '.join(zero)} {'is' if len(zero) == 1 else 'are'} 0 and the qform is the "
                "orientation: a voxel size of 0 is none (nibabel reads it as 1 mm)"
            )
    if pixdim[0] not in (-1.0, 0.0, 1.0):
        raise _refuse(
            f"pixdim[0] (qfac, the qform's handedness) is {pixdim[0]:g}, not 1 or -1 (0 read "
            "as 1): whether the slice axis is mirrored is unknown"
        )
    names = ("quatern_b", "quatern_c", "quatern_d", "qoffset_x", "qoffset_y", "qoffset_z")
    values = [float(header[name]) for name in names]
    bad = [f"{name} is {value:g}" for name, value in zip(names, values, strict=True)]
    if not all(math.isfinite(v) for v in values):
        raise _refuse(f"qform is not finite ({', '.join(bad)})")
    bcd = np.array(values[:3], header["quatern_b"].dtype)
    try:
        fillpositive(bcd, header.quaternion_threshold)
    except ValueError:
        norm = float(np.sum(np.asarray(values[:3]) ** 2))
        raise _refuse(
            f"qform quaternion is not a rotation: quatern_b, quatern_c, quatern_d are "
            f"{values[0]:g}, {values[1]:g}, {values[2]:g}, whose squares sum to {norm:g}, more "
            "than 1"
        ) from None


def _check_sform(header: nib.Nifti1Header) -> None:
    for row in ("srow_x", "srow_y", "srow_z"):
        values = [float(v) for v in header[row]]
        if not all(math.isfinite(v) for v in values):
            shown = ", ".join(f"{v:g}" for v in values)
            raise _refuse(f"{row} is ({shown}): the sform must hold finite numbers")


def _as_nibabel_reads(header: nib.Nifti1Header) -> nib.Nifti1Header:
    """nibabel's own checks and fixes, at the level its load refuses: what the checks
    above let pass and nibabel would not (the NIfTI-2 eol_check, say) is refused in its
    words."""
    copy = header.copy()
    try:
        copy.check_fix(logger=_QUIET, error_level=_NIBABEL_ERROR)
    except nib.spatialimages.HeaderDataError as exc:
        raise _refuse(f"fields are not usable: {exc}") from exc
    return copy


__all__ = ["INTENSITY_TYPES", "check_data_fields", "check_placement_fields", "header_end"]
