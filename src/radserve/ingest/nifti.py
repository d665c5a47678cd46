"""NIfTI in and out, through the Volume's own NIfTI convention (RAS, (i, j, k) order).

Integer data stays integer: an int16 volume is written as int16 with no scaling, and a
file whose scaling is integral and fits int16 is read back as int16.

A NIfTI upload meets the bounds a DICOM series meets (:class:`IngestPolicy`: voxels,
bytes, matrix, spacings, field of view, the in-plane field of a CT, MR or PET image,
positions), checked on its header before any voxel is read, and its voxels must be
finite numbers (and CT values on a CT scale).
Before session 35 none of them applied: a 3.4 KB ``.nii.gz`` of 64³ voxels at 1 m
spacing asked the model's resampling for a grid no memory holds and the OOM killer
stopped the server; NaN voxels, complex or RGB data ran, or failed as radserve's own
error.

nibabel reads only the fixed header (its checks and fixes applied): the header's fields
are checked one by one first (:mod:`radserve.ingest.nifti_fields`), and the extensions
and voxels are read by :mod:`radserve.ingest.nifti_bounds`, by the file's content
(gzip or not), never its name. Before the 2026-12 fuzzing, ``nibabel.load`` read the
file, and a damaged header failed as "not a readable NIfTI file (HeaderDataError)", a
NaN pixdim beside a valid sform as an ``internal_error`` (``LinAlgError``), a damaged
gzip stream as ``zlib.error``; a vox_offset of 0 ran on the header's bytes as voxels.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import BinaryIO

import nibabel as nib
import numpy as np

from radserve.domain.volume import Volume
from radserve.errors import GeometryError, StudyError
from radserve.ingest.ct_scale import check_ct_scale
from radserve.ingest.geometry import MAX_POSITION_MM, check_fov, check_range, refuse_wide_field
from radserve.ingest.nifti_bounds import DeclaredLayout, declared_layout, read_voxels
from radserve.ingest.nifti_fields import check_placement_fields
from radserve.ingest.policy import IngestPolicy, policy_hint
from radserve.ingest.resample import shift_slices_in_plane

_INT16 = np.iinfo(np.int16)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INVALID = "nifti_invalid"
_ORTHOGONAL_TOLERANCE = 1e-2  # |cos| of the in-plane axes, as for Image Orientation (Patient)


def load_nifti(
    path: Path | str,
    *,
    policy: IngestPolicy | None = None,
    modality: str | None = None,
    warnings: list[str] | None = None,
) -> Volume:
    """Read a 3-D NIfTI-1/2 file (a trailing singleton 4th axis is allowed) into a Volume.

    ``policy``: the ingest bounds checked before the voxels are read, for a file from
    outside (None: a file radserve wrote, such as a report's label map; its type, affine
    and values are still checked), with the DICOM path's geometry rules: an orientation
    must be declared (qform or sform), the in-plane axes orthogonal, and a slice axis
    off the plane's normal (a sheared affine, a gantry tilt) is what
    ``ingest.gantry_tilt`` says; ``modality``: the one the volume is taken as (``CT``:
    values must lie on a CT scale); ``warnings``: what was tolerated is appended there.

    Raises:
        StudyError: code ``nifti_invalid`` when the file is not a readable 3-D NIfTI
            image of intensities with a usable affine; ``series_too_large``,
            ``geometry_invalid``, ``implausible_pixel_values`` as for a DICOM series.
    """
    try:
        layout = declared_layout(path)
    except OSError as exc:  # missing or unreadable (a damaged gzip stream is named)
        raise StudyError(
            f"the NIfTI file cannot be read ({exc.strerror or type(exc).__name__})",
            code=_INVALID,
        ) from exc
    if policy is not None:
        _check_declared(layout, policy)  # before anything past the header is inflated
    header = _checked_header(layout)
    _check_scaling(layout)
    shape = layout.shape
    while len(shape) > 3 and shape[-1] == 1:
        shape = shape[:-1]
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3:
        raise StudyError(f"NIfTI image must be 3-D, got shape {layout.shape}", code=_INVALID)
    affine = header.get_best_affine()
    _check_header(header, shape, affine, policy, modality)
    tilt = None if policy is None else _check_orientation(header, affine, policy)
    ambiguous = [] if policy is None else _check_forms(header, layout, shape)
    if warnings is not None:
        warnings.extend(layout.notes)
        warnings.extend(ambiguous)
    try:
        data = _read_data(read_voxels(path, layout), header).reshape(shape)
    except OSError as exc:  # the disk, not the file: nothing in it is named
        raise StudyError(
            f"NIfTI voxel data could not be read ({exc.strerror or type(exc).__name__})",
            code=_INVALID,
        ) from exc
    _check_values(data, modality)
    volume = Volume.from_nifti_arrays(data, affine)
    if tilt is not None and policy is not None:
        volume, said = _tolerate_tilt(volume, tilt, policy, modality)
        if warnings is not None:
            warnings.append(said)
    return volume


def _check_orientation(
    header: nib.Nifti1Header, affine: np.ndarray, policy: IngestPolicy
) -> str | None:
    """The DICOM path's orientation rules on a NIfTI from outside; what a tolerated
    tilt is, in words (None: no tilt).

    No qform and no sform (both codes 0): nibabel makes up an affine from pixdim alone,
    so left and right, and where the volume lies, are a guess; such a file ran and its
    findings carried a side (``lung_left``) nothing in the file stated. Refused, as a
    DICOM series without Image Orientation (Patient) is: a report may not name a side it
    cannot know. In-plane axes that are not orthogonal are refused as a DICOM Image
    Orientation whose vectors are not orthogonal is; a slice axis off the plane's normal
    (a sheared affine: a gantry tilt kept in the affine) is what ``ingest.gantry_tilt``
    says of a DICOM stack (``reject`` by default)."""
    if int(header["qform_code"]) == 0 and int(header["sform_code"]) == 0:
        raise GeometryError(
            "the NIfTI header declares no orientation (qform_code and sform_code are both "
            "0): where the voxels lie in the patient, and which side is left, is unknown; "
            "write the file with its scanner orientation (sform or qform code 1 or 2)"
        )
    axes = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    i_dir, j_dir, k_dir = axes.T
    if abs(float(i_dir @ j_dir)) > _ORTHOGONAL_TOLERANCE:
        raise GeometryError(
            f"the NIfTI affine's in-plane axes (i, j) are {_degrees(i_dir, j_dir):.2f}° apart, "
            "not orthogonal: a sheared image plane"
        )
    normal = np.cross(i_dir, j_dir)
    tilt = _degrees(k_dir, normal / np.linalg.norm(normal), acute=True)
    if tilt <= policy.tilt_tolerance_deg:
        return None
    what = (
        f"sheared NIfTI affine: the slice axis (k) is {tilt:.2f}° from the normal of the "
        "image plane (a gantry tilt kept in the affine)"
    )
    if policy.gantry_tilt == "reject":
        raise GeometryError(
            f"{what}. To shift slices onto an orthogonal grid, "
            f"{policy_hint('gantry_tilt', 'correct')} ('flag' keeps the sheared affine)"
        )
    return what


def _check_forms(
    header: nib.Nifti1Header, layout: DeclaredLayout, shape: tuple[int, ...]
) -> list[str]:
    """The header's two orientations (qform and sform) where they leave the geometry
    ambiguous: a warning for each ambiguity the affine nibabel reads settles, a
    :class:`GeometryError` where left and right may be swapped.

    nibabel reads the sform when its code is set, else the qform (``get_best_affine``),
    and reads the qform's voxel sizes as ``|pixdim[1..3]|`` (the NIfTI standard keeps
    them positive and the handedness in qfac, pixdim[0]). radserve reads the same affine,
    and before session 37 said nothing of the other:

    * both codes set and the two placing a voxel more than :data:`_FORMS_AGREE_MM` apart
      (over the whole volume), or an axis more than :data:`_FORMS_AGREE_DEG` apart: the
      sform is used, with a warning naming the largest difference; refused when the two
      name other patient directions for a voxel axis (nibabel's ``aff2axcodes``, e.g.
      RAS against LAS): one of them has left and right (or another axis) the other way,
      and a report may not name a side it cannot know;
    * a negative pixdim[1..3] with the qform in use (sform code 0): refused. nibabel
      takes its absolute value, but a writer that stored the sign may have meant that
      axis mirrored, so which side is left is unknown. With the sform in use the sign
      only concerns the qform, which is compared with the sform as nibabel reads it."""
    assert layout.header is not None
    raw = np.asarray(layout.header["pixdim"], np.float64)  # as stored: nibabel's check
    negative = [f"pixdim[{i}] is {raw[i]:g}" for i in (1, 2, 3) if raw[i] < 0]
    if negative and int(header["sform_code"]) == 0:
        shown = ", ".join(negative)
        raise GeometryError(
            f"the NIfTI header's {shown}, negative, and its qform is the orientation: "
            "nibabel reads voxel sizes as |pixdim| (the NIfTI standard keeps them "
            "positive, the handedness in qfac, pixdim[0]), but a writer that stored the "
            "sign may have meant that axis mirrored, so which side is left is unknown; "
            "write positive pixdim and the orientation in the qform (qfac) or the sform"
        )
    if int(header["sform_code"]) == 0 or int(header["qform_code"]) == 0:
        return []
    sform, qform = header.get_sform(), header.get_qform()
    usable = np.isfinite(qform).all() and abs(np.linalg.det(qform[:3, :3])) >= 1e-12
    if not usable or None in nib.aff2axcodes(qform):
        # the sform is usable (_check_header); this qform, a TypeError before (a fuzzed
        # pixdim of 1e-30 beside a valid sform), cannot be compared with it
        raise GeometryError(
            "the NIfTI header's qform (set beside the sform) is degenerate: its voxel axes "
            f"(pixdim {', '.join(f'{v:g}' for v in raw[1:4])}) do not span space, so "
            "whether it agrees with the sform is unknown; write qform_code 0 if the sform "
            "alone is meant"
        )
    mm, degrees = _forms_apart(qform, sform, shape)
    if mm <= _FORMS_AGREE_MM and degrees <= _FORMS_AGREE_DEG:
        return []
    q_axes, s_axes = "".join(nib.aff2axcodes(qform)), "".join(nib.aff2axcodes(sform))
    if q_axes != s_axes:
        raise GeometryError(
            f"the NIfTI header's qform and sform (both set) disagree on which way the "
            f"voxel axes run: qform {q_axes}, sform {s_axes} (up to {mm:.1f} mm apart): "
            "one of them has left and right, or another axis, the other way round, and "
            "which is the patient's is unknown; write the file with one orientation (the "
            "qform and sform equal, or one of their codes 0)"
        )
    return [
        f"the NIfTI header's qform and sform (both set) disagree by up to {mm:.2f} mm "
        f"where they place a voxel and {degrees:.2f}° in an axis's direction (both "
        f"{s_axes}); the sform was used, as nibabel reads a file whose sform code is set"
    ]


_FORMS_AGREE_MM = 0.1  # the qform and sform place every voxel within this of each other
_FORMS_AGREE_DEG = 0.1  # and no voxel axis further apart than this


def _forms_apart(
    first: np.ndarray, second: np.ndarray, shape: tuple[int, ...]
) -> tuple[float, float]:
    """How far two affines place a voxel of a volume of ``shape`` (the largest distance,
    in mm: at a corner, as the maps are affine) and the largest angle (°) between the
    directions of a voxel axis."""
    corners = np.array(
        [
            [i, j, k, 1.0]
            for i in (0, shape[0] - 1)
            for j in (0, shape[1] - 1)
            for k in (0, shape[2] - 1)
        ]
    )
    mm = float(np.max(np.linalg.norm((corners @ (first - second).T)[:, :3], axis=1)))
    a = first[:3, :3] / np.linalg.norm(first[:3, :3], axis=0)
    b = second[:3, :3] / np.linalg.norm(second[:3, :3], axis=0)
    degrees = max(_degrees(a[:, i], b[:, i]) for i in range(3))
    return mm, degrees


def _degrees(a: np.ndarray, b: np.ndarray, *, acute: bool = False) -> float:
    """The angle between unit vectors ``a`` and ``b`` (``acute``: between the lines they
    lie on, at most 90°)."""
    cosine = float(np.clip(a @ b, -1.0, 1.0))
    return float(np.degrees(np.arccos(abs(cosine) if acute else cosine)))


def _tolerate_tilt(
    volume: Volume, what: str, policy: IngestPolicy, modality: str | None
) -> tuple[Volume, str]:
    """``flag``: the sheared affine kept, said; ``correct``: each slice shifted in-plane
    onto an orthogonal grid, as :func:`radserve.ingest.geometry.plan_stack` does."""
    if policy.gantry_tilt == "flag":
        return volume, f"{what}; kept the exact sheared (non-orthogonal) affine"
    affine = volume.affine.copy()
    step_vec, row_vec, col_vec = affine[:3, 0], affine[:3, 1], affine[:3, 2]
    row_spacing, col_spacing = float(np.linalg.norm(row_vec)), float(np.linalg.norm(col_vec))
    in_plane = np.array([row_vec / row_spacing, col_vec / col_spacing]).T  # (3, 2)
    normal = np.cross(row_vec, col_vec)
    normal /= np.linalg.norm(normal)
    step = float(step_vec @ normal)
    normal *= np.sign(step)
    drift = np.outer(np.arange(volume.shape[0]), step_vec - normal * abs(step))
    shifts = (drift @ in_plane) / np.array([row_spacing, col_spacing])
    array = volume.array.copy()
    air = policy.ct_padding_hu if modality == "CT" else policy.other_padding_value
    shift_slices_in_plane(array, shifts, air)
    affine[:3, 0] = normal * abs(step)
    said = (
        f"{what}; slices shifted in-plane by up to {float(np.max(np.abs(shifts))):.1f} "
        "pixels onto an orthogonal grid"
    )
    return Volume(array, affine), said


def _check_header(
    header: nib.Nifti1Header,
    shape: tuple[int, ...],
    affine: np.ndarray,
    policy: IngestPolicy | None,
    modality: str | None,
) -> None:
    """The affine and the DICOM path's bounds, on what the header declares (nothing is
    read yet; the voxel type: :mod:`radserve.ingest.nifti_fields`)."""
    source = _affine_source(header)
    if not np.isfinite(affine).all():
        raise StudyError(
            f"NIfTI affine holds values that are not finite (read from {source})",
            code=_INVALID,
        )
    if abs(np.linalg.det(affine[:3, :3])) < 1e-12:
        raise StudyError(
            f"NIfTI affine is singular (read from {source}): its voxel axes do not span "
            "space (an axis of length 0, or two along one line)",
            code=_INVALID,
        )
    if policy is not None:
        _check_bounds(shape, header.get_data_dtype(), affine, policy, modality)


def _affine_source(header: nib.Nifti1Header) -> str:
    """The header fields the affine nibabel reads comes from, in words."""
    if int(header["sform_code"]) != 0:
        return "the sform: srow_x, srow_y, srow_z"
    if int(header["qform_code"]) != 0:
        return "the qform: quatern_b/c/d, qoffset_x/y/z and pixdim"
    return "pixdim alone: no qform or sform"


def _check_bounds(
    shape: tuple[int, ...],
    dtype: np.dtype,
    affine: np.ndarray,
    policy: IngestPolicy,
    modality: str | None,
) -> None:
    columns, rows, slices = (int(n) for n in shape)  # (i, j, k): k is the slice axis
    if min(rows, columns) < policy.min_matrix:
        raise GeometryError(
            f"the NIfTI image is {columns} × {rows} voxels in plane (i × j), fewer than "
            f"ingest.min_matrix={policy.min_matrix} along an axis: not a cross-sectional image "
            "a model can read"
        )
    voxels = slices * rows * columns
    if voxels > policy.max_voxels:
        raise StudyError(
            f"NIfTI image of {voxels} voxels ({columns} × {rows} × {slices}), more than "
            f"IngestPolicy.max_voxels={policy.max_voxels}",
            code="series_too_large",
        )
    if voxels * dtype.itemsize > policy.max_file_bytes:
        raise StudyError(
            f"NIfTI voxel data of {voxels * dtype.itemsize} bytes ({dtype}), more than "
            f"ingest.max_file_bytes={policy.max_file_bytes}",
            code="series_too_large",
        )
    column_mm, row_mm, slice_mm = (float(v) for v in np.linalg.norm(affine[:3, :3], axis=0))
    check_range(
        "NIfTI in-plane voxel size",
        f"{column_mm:g}\\{row_mm:g}",
        (column_mm, row_mm),
        policy.min_spacing_mm,
        policy.max_pixel_spacing_mm,
        "ingest.min_spacing_mm / ingest.max_pixel_spacing_mm",
    )
    check_range(
        "NIfTI slice spacing",
        f"{slice_mm:g}",
        (slice_mm,),
        policy.min_spacing_mm,
        policy.max_slice_spacing_mm,
        "ingest.min_spacing_mm / ingest.max_slice_spacing_mm",
    )
    check_fov((rows * row_mm, columns * column_mm), slice_mm, slices, policy)
    # the plane is (i, j): k is the slice axis, as for the matrix and the spacings above
    refuse_wide_field(
        (columns * column_mm, rows * row_mm),
        modality,
        policy,
        images="the NIfTI slices span",
        pixels=f"{columns} × {rows} voxels along i × j of {column_mm:g}\\{row_mm:g} mm",
        spacing="voxel size (the affine's or pixdim's)",
    )
    far = float(np.abs(affine[:3, 3]).max())
    if far > MAX_POSITION_MM:
        raise GeometryError(
            f"the NIfTI affine places the first voxel {far:g} mm from the origin, more than "
            f"{MAX_POSITION_MM:g} mm: not a patient position"
        )


def _check_values(data: np.ndarray, modality: str | None) -> None:
    """Voxels must be numbers a model can read: NaN or infinity ran through the models
    and into the findings' mean HU; CT values past any CT scale are not HU."""
    if data.dtype.kind != "f" or not data.size:
        bad = 0
    else:
        bad = int(data.size - np.count_nonzero(np.isfinite(data)))
    if bad:
        raise StudyError(
            f"{bad} of {data.size} NIfTI voxels are not finite numbers (NaN or infinity)",
            code="implausible_pixel_values",
        )
    if data.dtype.itemsize > 4 and data.dtype.kind == "f" and data.size:
        # float64 (datatype 64) past float32 turns infinite where a model reads float32:
        # an MR NIfTI of 1e300 passed every check here (CT values meet the CT scale)
        wide = int(np.count_nonzero(np.abs(data) > _FLOAT32_MAX))
        if wide:
            raise StudyError(
                f"{wide} of {data.size} NIfTI voxels lie beyond what a 32-bit float holds "
                f"(±{_FLOAT32_MAX:.3g}), as the models read them: write values in the "
                "image's physical units",
                code="implausible_pixel_values",
            )
    if modality == "CT":
        check_ct_scale(
            data,
            "NIfTI CT values",
            "a NIfTI CT must hold Hounsfield units (scaling by scl_slope / scl_inter applied)",
        )


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


def _checked_header(layout: DeclaredLayout) -> nib.Nifti1Header:
    """The header as nibabel's load reads it (its fixes applied: |pixdim|, a qfac of 0
    as 1), once the fields that place the voxels are checked
    (:func:`~radserve.ingest.nifti_fields.check_placement_fields`). nibabel itself reads
    neither the extensions nor the voxels (:func:`read_voxels`)."""
    assert layout.header is not None
    return check_placement_fields(layout.header)


def _check_scaling(layout: DeclaredLayout) -> None:
    """scl_slope and scl_inter: the NIfTI standard scales the voxels when scl_slope is
    not 0. nibabel writes NaN for "no scaling" (its float images), and reads 0 and NaN
    so, as radserve does; but it read an infinite scl_slope as "no scaling" too (a file
    with scl_slope inf ran on its stored values, as a DICOM Rescale Slope of inf did
    before it was refused), and a NaN or infinite scl_inter beside a usable slope as an
    unreadable file ("HeaderDataError"). Both are refused here, saying what is wrong."""
    slope, intercept = layout.scaling
    scaled = slope != 0 and not math.isnan(slope)
    if math.isinf(slope) or (scaled and not math.isfinite(intercept)):
        raise StudyError(
            f"the NIfTI header's scaling is not usable: scl_slope {slope:g}, scl_inter "
            f"{intercept:g} (the voxels are scaled when scl_slope is a number other than 0, "
            "and both must then be finite); write scl_slope 0 for unscaled voxels",
            code=_INVALID,
        )


def _check_declared(layout: DeclaredLayout, policy: IngestPolicy) -> None:
    """The sizes the header declares against the bounds, before anything past the fixed
    header is inflated: what precedes the voxels (extensions) against
    ``max_header_bytes``, the voxels against ``max_voxels`` and ``max_file_bytes``."""
    if layout.offset > policy.max_header_bytes:
        raise StudyError(
            f"the NIfTI header declares {layout.offset} bytes before its voxel data "
            f"(vox_offset: header and extensions), more than "
            f"ingest.max_header_bytes={policy.max_header_bytes}",
            code="series_too_large",
        )
    if layout.voxels > policy.max_voxels:
        raise StudyError(
            f"NIfTI image of {layout.voxels} voxels (declared shape "
            f"{' x '.join(map(str, layout.shape))}), more than "
            f"IngestPolicy.max_voxels={policy.max_voxels}",
            code="series_too_large",
        )
    if layout.data_bytes > policy.max_file_bytes:
        raise StudyError(
            f"NIfTI voxel data of {layout.data_bytes} bytes ({layout.dtype}), more than "
            f"ingest.max_file_bytes={policy.max_file_bytes}",
            code="series_too_large",
        )


def _read_data(raw: np.ndarray, header: nib.Nifti1Header) -> np.ndarray:
    """The voxels ``raw`` (as stored) scaled as ``header`` says (:func:`_check_scaling`
    refused a scaling that cannot be applied). A finite scaling that takes a stored
    value past float32 (scl_slope 1e38) made infinite voxels, refused as such without
    naming the scaling: refused here, naming it."""
    slope, inter = header.get_slope_inter()
    if slope is None or (slope, inter) == (1.0, 0.0):
        return raw
    inter = 0.0 if inter is None else inter
    if not raw.size:
        return raw.astype(np.float32)
    low, high = float(np.min(raw)), float(np.max(raw))
    ends = sorted((low * slope + inter, high * slope + inter))
    stored_finite = math.isfinite(low) and math.isfinite(high)  # else told later
    if stored_finite and max(abs(ends[0]), abs(ends[1])) > _FLOAT32_MAX:
        raise StudyError(
            f"the NIfTI header's scaling takes the stored values ({low:g} to {high:g}) to "
            f"{ends[0]:g} to {ends[1]:g}, beyond what a 32-bit float holds: scl_slope "
            f"{slope:g}, scl_inter {inter:g}; write the voxels in their own units "
            "(scl_slope 0 or 1)",
            code="implausible_pixel_values",
        )
    integral = float(slope).is_integer() and float(inter).is_integer()
    if raw.dtype.kind in "iu" and integral and _INT16.min <= ends[0] <= ends[1] <= _INT16.max:
        return (raw.astype(np.int32) * int(slope) + int(inter)).astype(np.int16)
    return np.asarray(raw, dtype=np.float32) * np.float32(slope) + np.float32(inter)


def _is_orthogonal(affine: np.ndarray, tol: float = 1e-6) -> bool:
    axes = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    return bool(np.allclose(axes.T @ axes, np.eye(3), atol=tol))
