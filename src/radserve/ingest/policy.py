"""What ingest does when a series is not a clean, regular stack.

Each problem has a named choice: ``reject`` raises the matching :class:`StudyError`
with the reason; the other choices proceed and record a warning on the loaded series.
The defaults refuse anything that would silently put voxels in the wrong place.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal, get_args, get_type_hints

if TYPE_CHECKING:  # the settings section is read, never imported at run time
    from radserve.config import IngestSettings

GapChoice = Literal["reject", "flag", "resample"]
TiltChoice = Literal["reject", "flag", "correct"]
DuplicateChoice = Literal["reject", "drop_identical", "keep_first"]
SplitChoice = Literal["split", "reject"]
LocalizerChoice = Literal["drop", "reject"]


def policy_hint(name: str, value: str) -> str:
    """How a user changes one ingest choice, in the words of the settings and the CLI (the
    one wording every "set ... to proceed" message uses)."""
    return (
        f"set ingest.{name}: {value} in the settings (RADSERVE_INGEST__{name.upper()}={value}),"
        f" or pass --ingest {name}={value} to radserve run"
    )


@dataclass(frozen=True)
class IngestPolicy:
    """Per-problem choices and the tolerances that define the problems.

    Attributes:
        missing_slices: a gap larger than ``missing_slice_factor`` × the median spacing.
            ``flag`` keeps the slices on a regular grid of the mean spacing (positions
            between the gap are then approximate); ``resample`` interpolates linearly onto
            a regular grid of the median spacing (slices then no longer map one-to-one to
            source instances).
        nonuniform_spacing: a gap differing from the median by more than
            ``spacing_tolerance`` × median; same choices as ``missing_slices``.
        gantry_tilt: the first→last position vector is more than ``tilt_tolerance_deg``
            from the slice normal. ``flag`` keeps the exact, sheared affine (non-orthogonal
            columns); ``correct`` shifts each slice in-plane onto an orthogonal grid.
        duplicate_positions: two instances at the same position along the normal.
            ``drop_identical`` drops a copy whose pixels equal the kept one and rejects
            otherwise; ``keep_first`` keeps the lowest Instance Number.
        mixed_orientation: the series UID holds stacks of different orientation (each
            becomes its own part in discovery); ``reject`` refuses to load any of them.
        mismatched_dimensions: likewise for instances with other Rows/Columns.
        localizers: localizer/scout images mixed into the series.
        ct_padding_hu: value written where CT pixels equal Pixel Padding Value (air).
        other_padding_value: same for other modalities.
        max_voxels: largest volume (slices × rows × columns) accepted, so a hostile or
            broken header cannot ask for an allocation the host cannot make (2**30 voxels:
            2 GiB as int16, 4 GiB as float32). A model's grid of the study (its crop at
            the model's spacing) is bounded by it too, refused before it is allocated
            (``series_too_large``, :func:`radserve.preprocess.resample.check_grid`): a
            spacing finer than the study's multiplies the voxels ingest accepted.
        max_file_bytes: largest single file (or zip member, or inflated Deflated file).
            A member decoded for pixels is copied to a spooled temporary file, so this
            bounds disk, not memory.
        max_header_bytes: most bytes read into memory from one file's header (values over
            64 KiB that radserve does not need are skipped unread and do not count).
        max_header_elements: most data elements (items and delimiters included) read
            from one streamed header: each costs some 400-800 bytes of Python objects
            whatever its size, so 1,000,000 private elements of 2 bytes (10 MB) cost 760 MB
            at the STOW-RS check; 500,000 is some 20 per frame of a 25,000-frame
            Enhanced CT.
        max_study_bytes: largest total size of all files of one ingest (declared sizes for
            zip members, which zipfile never exceeds), checked before any header is read.
        max_frames: most frames (2-D images) one file may claim and one ingest may hold;
            frame records are made only after the claim is checked against the pixel data.
        max_archive_members: most entries one zip archive may list, read from its end
            record before its central directory is parsed (each entry costs Python
            objects and, in discovery, an open): refused at the upload's door and at
            ingest (``archive_rejected``).
        min_spacing_mm / max_pixel_spacing_mm / max_slice_spacing_mm: accepted Pixel Spacing
            and slice step; values outside (1e4, 1e30, 0, negative) are refused at ingest,
            before they reach resampling.
        max_fov_mm: largest extent of the volume along any axis (voxels × spacing).
        max_in_plane_field_mm: widest in-plane field (Rows or Columns × Pixel Spacing; a
            NIfTI's i and j voxels × voxel size) of a CT, MR or PET image, checked before
            a pixel is read. The widest bores are 80-90 cm (wide-bore CT; an extended-field
            reconstruction reaches about 80 cm, an MR's or a PET's field 50-78 cm), so
            1000 mm leaves room; ``max_fov_mm`` bounds every axis and let 128 × 128 images
            of 19.5 mm pixels through (2,496 mm): 100 of them, 3 MB, cost 228 CPU-s and
            1.8 GB resampled to a model's 1.5 mm (session 43). A setting since 2026-12-07
            (a constant before), for a site whose images come from elsewhere than a
            patient scanner (a large-animal bore, a synthetic phantom).
        min_matrix: fewest Rows and Columns an image of a volume may have: a stack of
            1 × 1 (or 1 × 65,535) images is no cross-sectional image, and a model run on it
            reports findings in noise.
        input_domain: a study outside a model's declared ``input_domain`` (model.yaml):
            ``flag`` runs it with an ``outside_input_domain`` report warning, ``refuse``
            fails it with that code before any model runs.
        lossy_input: lossy compressed images (Lossy Image Compression 01, or a lossy-only
            transfer syntax): ``flag`` runs them with a ``lossy_input`` report warning (in
            the SR and the FHIR conclusion too), ``refuse`` fails the job with that code
            (a site whose models were validated on original images only).
    """

    missing_slices: GapChoice = "reject"
    nonuniform_spacing: GapChoice = "reject"
    gantry_tilt: TiltChoice = "reject"
    duplicate_positions: DuplicateChoice = "drop_identical"
    mixed_orientation: SplitChoice = "split"
    mismatched_dimensions: SplitChoice = "split"
    localizers: LocalizerChoice = "drop"
    missing_slice_factor: float = 1.5
    spacing_tolerance: float = 0.02
    tilt_tolerance_deg: float = 0.5
    ct_padding_hu: float = -1000.0
    other_padding_value: float = 0.0
    max_voxels: int = 2**30
    max_file_bytes: int = 4 * 2**30
    max_header_bytes: int = 64 * 2**20
    max_header_elements: int = 500_000
    max_study_bytes: int = 16 * 2**30
    max_frames: int = 50_000
    max_archive_members: int = 50_000
    min_spacing_mm: float = 0.01
    max_pixel_spacing_mm: float = 20.0
    max_slice_spacing_mm: float = 50.0
    max_fov_mm: float = 2500.0
    max_in_plane_field_mm: float = 1000.0
    min_matrix: int = 8
    input_domain: Literal["flag", "refuse"] = "flag"
    lossy_input: Literal["flag", "refuse"] = "flag"

    @classmethod
    def from_settings(cls, settings: IngestSettings) -> IngestPolicy:
        """The policy the ``ingest`` settings section describes (same names, same
        meaning; ``tests/unit/test_settings_coverage.py`` keeps the two equal)."""
        return cls(**settings.model_dump())

    def __post_init__(self) -> None:
        hints = get_type_hints(IngestPolicy)
        for f in fields(self):
            allowed = get_args(hints[f.name])
            value = getattr(self, f.name)
            if allowed and value not in allowed:
                close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"IngestPolicy.{f.name} must be one of {list(allowed)}, got {value!r}{hint}"
                )
        if self.missing_slice_factor <= 1.0:
            raise ValueError("IngestPolicy.missing_slice_factor must be > 1")
        if not 0.0 < self.spacing_tolerance < 0.5:
            raise ValueError("IngestPolicy.spacing_tolerance must be in (0, 0.5)")
        if self.tilt_tolerance_deg < 0.0:
            raise ValueError("IngestPolicy.tilt_tolerance_deg must be >= 0")
        for name in (
            "max_voxels",
            "max_file_bytes",
            "max_header_bytes",
            "max_header_elements",
            "max_study_bytes",
            "max_frames",
            "max_archive_members",
            "min_spacing_mm",
            "max_fov_mm",
            "max_in_plane_field_mm",
            "min_matrix",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"IngestPolicy.{name} must be > 0")
        if not self.min_spacing_mm < min(self.max_pixel_spacing_mm, self.max_slice_spacing_mm):
            raise ValueError("IngestPolicy.min_spacing_mm must be below the largest spacings")
