"""Order frames into a stack and derive its affine, applying the policy to each defect.

Pure geometry on header values, no pixel I/O. Slices are sorted by their position
projected on the slice normal (cross product of the Image Orientation (Patient) row and
column vectors), never by Instance Number; the slice step comes from the positions,
never from Slice Thickness. Tolerances: positions closer than
:data:`DUPLICATE_TOLERANCE_MM` along the normal are duplicates; a gap above
``missing_slice_factor`` × the median gap is a missing slice; any other gap off the
median by more than ``spacing_tolerance`` × median is non-uniform spacing; a first→last
vector more than ``tilt_tolerance_deg`` off the normal is a gantry tilt; in-plane
positions more than :data:`LINE_TOLERANCE_PX` pixels off the first→last line are a
sheared (non-linear) stack.

Before any of that, the values are bounded (``IngestPolicy`` ``min_spacing_mm``,
``max_pixel_spacing_mm``, ``max_slice_spacing_mm``, ``max_fov_mm``,
``max_in_plane_field_mm``; positions within :data:`MAX_POSITION_MM`): a Pixel Spacing
of 1e4 or 1e30 is refused here, naming the attribute and its value, instead of asking
resampling for a grid of TiBs later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from radserve.errors import GeometryError
from radserve.ingest.headers import FrameRef
from radserve.ingest.policy import IngestPolicy, policy_hint

DUPLICATE_TOLERANCE_MM = 0.01
LINE_TOLERANCE_PX = 0.1
_UNIT_TOLERANCE = 1e-2
MAX_POSITION_MM = 1e6  # 1 km from the origin: beyond any patient coordinate system
# the modalities whose image is a scanner's cross-section, bounded in its plane by
# ingest.max_in_plane_field_mm (a whole-body planar NM is 2 m long: max_fov_mm only)
_BOUNDED_IN_PLANE = frozenset({"CT", "MR", "PT"})


class SpacingError(GeometryError):
    """Missing slices or non-uniform spacing the policy rejects: ``detail`` says what was
    found, ``advice`` the setting that would proceed. Apart, so that ingest can say why a
    slice is missing (set aside, unreadable) before the advice, or leave out advice that
    would not help (a slice of another size lies in the gap: resampling fills the gap,
    and the series is refused for the odd slice all the same)."""

    def __init__(self, detail: str, advice: str) -> None:
        super().__init__(f"{detail}. {advice}")
        self.detail = detail
        self.advice = advice


@dataclass(frozen=True, eq=False)
class StackLayout:
    """How decoded frames become the volume.

    ``order`` lists indices into the header's frames, one per decoded slice, ascending
    along the normal. ``duplicates`` pairs each dropped frame with the kept frame at the
    same position (to verify they are identical). ``in_plane_shifts`` (rows, columns in
    pixels, per slice) shear-correct a tilted stack; ``target_offsets`` (mm along the
    normal from the first slice) ask for resampling onto a regular grid; ``affine`` is
    the geometry of the final array.
    """

    order: tuple[int, ...]
    duplicates: tuple[tuple[int, int], ...]
    affine: np.ndarray
    source_offsets: np.ndarray
    target_offsets: np.ndarray | None
    in_plane_shifts: np.ndarray | None
    warnings: tuple[str, ...]


def plan_stack(frames: Sequence[FrameRef], policy: IngestPolicy) -> StackLayout:
    """Sort, check and describe the stack; raise :class:`GeometryError` where rejected."""
    _require_geometry(frames)
    row_dir, col_dir, normal = _axes(frames[0].orientation)  # type: ignore[arg-type]
    row_spacing, col_spacing = frames[0].pixel_spacing  # type: ignore[misc]
    check_range(
        "Pixel Spacing",
        f"{row_spacing:g}\\{col_spacing:g}",
        (row_spacing, col_spacing),
        policy.min_spacing_mm,
        policy.max_pixel_spacing_mm,
        "ingest.min_spacing_mm / ingest.max_pixel_spacing_mm",
    )
    positions = np.array([f.position for f in frames], dtype=np.float64)
    far = np.abs(positions).max(axis=1) > MAX_POSITION_MM
    if far.any():
        shown = "\\".join(f"{v:g}" for v in positions[int(np.argmax(far))])
        raise GeometryError(
            f"Image Position (Patient) {shown} mm is more than {MAX_POSITION_MM:g} mm from the "
            f"origin ({int(far.sum())} of {len(frames)} frames): not a patient position"
        )
    along = positions @ normal
    tie = [(f.instance_number or 0, f.frame_index or 0) for f in frames]
    order = sorted(range(len(frames)), key=lambda i: (along[i], *tie[i]))

    warnings: list[str] = []
    order, duplicates = _drop_duplicates(order, along, policy, warnings)
    pts = positions[order]
    offsets = along[order] - along[order[0]]
    in_plane = np.array([col_dir, row_dir]).T  # (3, 2): row-index and column-index axes
    affine = np.eye(4)
    affine[:3, 1] = col_dir * row_spacing
    affine[:3, 2] = row_dir * col_spacing
    affine[:3, 3] = pts[0]
    extent = (row_spacing * frames[0].pixel.rows, col_spacing * frames[0].pixel.columns)
    if len(order) == 1:
        step = _single_slice_step(frames[order[0]], policy, warnings)
        affine[:3, 0] = normal * step
        check_fov(extent, step, 1, policy)
        return StackLayout(tuple(order), duplicates, affine, offsets, None, None, tuple(warnings))

    try:
        target, step = _check_spacing(offsets, policy, warnings)
    except GeometryError as exc:
        if not duplicates:
            raise
        # the gap is most likely where a slice with a wrong position belongs
        at = float(along[duplicates[0][1]] - along[order[0]])
        raise GeometryError(
            f"{exc.message}; {len(duplicates)} slice(s) share their position with another "
            f"(first at {at:.2f} mm from the first slice): a slice with a wrong Image "
            "Position (Patient) leaves such a gap"
        ) from exc
    check_range(
        "slice spacing (from Image Position (Patient))",
        f"{step:g}",
        (step,),
        policy.min_spacing_mm,
        policy.max_slice_spacing_mm,
        "ingest.min_spacing_mm / ingest.max_slice_spacing_mm",
    )
    check_fov(extent, step, len(order) if target is None else len(target), policy)
    affine[:3, 0] = normal * step

    shifts = None
    drift = (pts - pts[0]) - np.outer(offsets, normal)  # in-plane offset of each slice (mm)
    line = np.outer(offsets / offsets[-1], drift[-1])
    off_line = float(np.max(np.linalg.norm(drift - line, axis=1)))
    tilt = math.degrees(math.atan2(float(np.linalg.norm(drift[-1])), float(offsets[-1])))
    non_linear = off_line > LINE_TOLERANCE_PX * min(row_spacing, col_spacing)
    if tilt > policy.tilt_tolerance_deg or non_linear:
        what = (
            f"gantry tilt or sheared stack: the first→last slice vector is {tilt:.2f}° from "
            "the slice normal"
            if tilt > policy.tilt_tolerance_deg
            else "sheared stack"
        )
        if non_linear:
            what += f"; slice positions leave the first→last line by up to {off_line:.2f} mm"
        if policy.gantry_tilt == "reject":
            raise GeometryError(
                f"{what}. To shift slices onto an orthogonal grid, "
                f"{policy_hint('gantry_tilt', 'correct')} ('flag' keeps the sheared affine)"
            )
        if policy.gantry_tilt == "flag":
            if non_linear:
                raise GeometryError(
                    f"{what}, so no single affine describes the stack; "
                    f"{policy_hint('gantry_tilt', 'correct')}"
                )
            if target is not None:
                raise GeometryError(
                    f"{what}; resampling a sheared stack needs gantry_tilt='correct'"
                )
            affine[:3, 0] = (pts[-1] - pts[0]) / (len(order) - 1)
            warnings.append(f"{what}; kept the exact sheared (non-orthogonal) affine")
        else:
            shifts = (drift @ in_plane) / np.array([row_spacing, col_spacing])
            warnings.append(
                f"{what}; slices shifted in-plane by up to "
                f"{float(np.max(np.abs(shifts))):.1f} pixels onto an orthogonal grid"
            )
    return StackLayout(tuple(order), duplicates, affine, offsets, target, shifts, tuple(warnings))


def _require_geometry(frames: Sequence[FrameRef]) -> None:
    for attr, name, count in (
        ("position", "Image Position (Patient)", 3),
        ("orientation", "Image Orientation (Patient)", 6),
        ("pixel_spacing", "Pixel Spacing", 2),
    ):
        lacking = [f for f in frames if getattr(f, attr) is None]
        if not lacking:
            continue
        shown = next((u for f in lacking for u in f.unusable if u.startswith(name)), None)
        if shown is not None:
            raise GeometryError(
                f"{len(lacking)} of {len(frames)} frames have an unusable {name} (e.g. "
                f"{lacking[0].label}: {shown}); it must be {count} finite numbers "
                "separated by backslashes, with a point as the decimal mark"
            )
        raise GeometryError(
            f"{len(lacking)} of {len(frames)} frames have no {name}: not a "
            "cross-sectional image stack (projection, secondary capture or cine?)"
        )


def check_range(
    name: str, shown: str, values: Sequence[float], low: float, high: float, settings: str
) -> None:
    if all(low <= v <= high for v in values):
        return
    raise GeometryError(
        f"{name} {shown} mm is outside the accepted {low:g}–{high:g} mm ({settings}): "
        "the header is damaged or not a patient image"
    )


def check_in_plane_field(frame: FrameRef, modality: str, policy: IngestPolicy) -> None:
    """Refuse a CT, MR or PET image wider than ``ingest.max_in_plane_field_mm`` in its
    plane (``geometry_invalid``), before any pixel is decoded: its Pixel Spacing is not
    the image's, and resampling it to a model's spacing costs minutes and gigabytes.
    Other modalities (a whole-body planar NM is 2 m long) are bounded by ``max_fov_mm``."""
    if frame.pixel_spacing is None:
        return
    row_spacing, col_spacing = frame.pixel_spacing
    rows, columns = frame.pixel.rows, frame.pixel.columns
    refuse_wide_field(
        (rows * row_spacing, columns * col_spacing),
        modality,
        policy,
        images="the images span",
        pixels=f"{rows} × {columns} pixels of Pixel Spacing {row_spacing:g}\\{col_spacing:g} mm",
        spacing="Pixel Spacing",
    )


def refuse_wide_field(
    field: tuple[float, float],
    modality: str | None,
    policy: IngestPolicy,
    *,
    images: str,
    pixels: str,
    spacing: str,
) -> None:
    """The in-plane field bound, in one wording for DICOM and NIfTI: ``field`` (mm along
    the image's two in-plane axes) of a CT, MR or PET image against
    ``ingest.max_in_plane_field_mm``; ``images`` starts the sentence ("the images span"),
    ``pixels`` says the matrix and its spacing, ``spacing`` names the header's value."""
    if modality not in _BOUNDED_IN_PLANE or max(field) <= policy.max_in_plane_field_mm:
        return
    raise GeometryError(
        f"{images} {field[0]:g} × {field[1]:g} mm in their plane ({pixels}), more than the "
        f"{policy.max_in_plane_field_mm:g} mm of any {modality} scanner's field "
        f"(ingest.max_in_plane_field_mm): the {spacing} is not the image's (a damaged or "
        "rewritten header); correct it at the source"
    )


def check_fov(
    extent: tuple[float, float], step: float, n_slices: int, policy: IngestPolicy
) -> None:
    sizes = {"slice": step * n_slices, "column": extent[0], "row": extent[1]}
    for axis, size in sizes.items():
        if size > policy.max_fov_mm:
            raise GeometryError(
                f"the volume would extend {size:g} mm along its {axis} axis, more than "
                f"ingest.max_fov_mm={policy.max_fov_mm:g} (Pixel Spacing or slice positions "
                "implausible for a patient)"
            )


def _axes(iop: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    row_dir, col_dir = np.array(iop[:3], float), np.array(iop[3:], float)
    nr, nc = np.linalg.norm(row_dir), np.linalg.norm(col_dir)
    if abs(nr - 1) > _UNIT_TOLERANCE or abs(nc - 1) > _UNIT_TOLERANCE:
        raise GeometryError(
            f"Image Orientation (Patient) vectors must be unit length, got {nr:.3f} and {nc:.3f}"
        )
    row_dir, col_dir = row_dir / nr, col_dir / nc
    if abs(float(row_dir @ col_dir)) > _UNIT_TOLERANCE:
        raise GeometryError("Image Orientation (Patient) row and column vectors are not orthogonal")
    col_dir = col_dir - (col_dir @ row_dir) * row_dir
    col_dir /= np.linalg.norm(col_dir)
    return row_dir, col_dir, slice_normal((*row_dir, *col_dir))  # type: ignore[return-value]


def slice_normal(orientation: Sequence[float] | None) -> np.ndarray | None:
    """The slice normal of an Image Orientation (Patient): its row vector × its column
    vector, unit length; None when it is not six numbers or the vectors are parallel or
    not finite. The one definition: ingest's split (:mod:`radserve.ingest.discover`)
    and the stack plan (:func:`plan_stack`, after checking the vectors) both use it."""
    if orientation is None or len(orientation) != 6:
        return None
    normal = np.cross(np.asarray(orientation[:3], float), np.asarray(orientation[3:], float))
    length = float(np.linalg.norm(normal))
    return normal / length if length and math.isfinite(length) else None


def _drop_duplicates(
    order: list[int], along: np.ndarray, policy: IngestPolicy, warnings: list[str]
) -> tuple[list[int], tuple[tuple[int, int], ...]]:
    kept = [order[0]]
    pairs = []
    for i in order[1:]:
        if along[i] - along[kept[-1]] < DUPLICATE_TOLERANCE_MM:
            pairs.append((i, kept[-1]))
        else:
            kept.append(i)
    if not pairs:
        return order, ()
    first = float(along[pairs[0][1]])
    if policy.duplicate_positions == "reject":
        raise GeometryError(
            f"{len(pairs)} slices share their position along the slice normal with another "
            f"slice (first at {first:.2f} mm); to drop exact copies, "
            f"{policy_hint('duplicate_positions', 'drop_identical')}"
        )
    if policy.duplicate_positions == "keep_first":
        warnings.append(
            f"dropped {len(pairs)} slices at duplicate positions (first at {first:.2f} mm), "
            "keeping the lowest Instance Number"
        )
    return kept, tuple(pairs)


def _single_slice_step(frame: FrameRef, policy: IngestPolicy, warnings: list[str]) -> float:
    for value, name in (
        (frame.spacing_between_slices, "Spacing Between Slices"),
        (frame.slice_thickness, "Slice Thickness"),
    ):
        if value is not None and policy.min_spacing_mm <= value <= policy.max_slice_spacing_mm:
            warnings.append(f"single slice: slice spacing taken from {name} ({value:g} mm)")
            return value
    warnings.append("single slice: no slice spacing in the header, 1 mm assumed")
    return 1.0


def _check_spacing(
    offsets: np.ndarray, policy: IngestPolicy, warnings: list[str]
) -> tuple[np.ndarray | None, float]:
    """Judge the gaps; return (resampling targets or None, slice step in mm)."""
    gaps = np.diff(offsets)
    median = float(np.median(gaps))
    mean = float(offsets[-1] / (len(offsets) - 1))
    missing = gaps > policy.missing_slice_factor * median
    uneven = ~missing & (np.abs(gaps - median) > policy.spacing_tolerance * median)
    resample = False
    for mask, choice, label, field_name in (
        (missing, policy.missing_slices, "missing slices", "missing_slices"),
        (uneven, policy.nonuniform_spacing, "non-uniform slice spacing", "nonuniform_spacing"),
    ):
        if not mask.any():
            continue
        where = np.flatnonzero(mask)
        detail = (
            f"{label}: {len(where)} gaps of {_mm(gaps[where])} mm where the median spacing is "
            f"{median:.3f} mm (first after slice {int(where[0])} of {len(offsets)})"
        )
        if choice == "reject":
            raise SpacingError(
                detail,
                f"To interpolate onto a regular grid, {policy_hint(field_name, 'resample')} "
                "('flag' proceeds as it is)",
            )
        if choice == "resample":
            resample = True
            warnings.append(f"{detail}; resampled onto a regular {median:.3f} mm grid")
        else:
            warnings.append(
                f"{detail}; kept on a regular {mean:.3f} mm grid, so slice positions are "
                "approximate"
            )
    if not resample:
        return None, mean
    count = round(float(offsets[-1]) / median) + 1
    return np.arange(count) * median, median


def _mm(values: np.ndarray) -> str:
    shown = ", ".join(f"{v:.2f}" for v in values[:3])
    return shown + (", …" if len(values) > 3 else "")
