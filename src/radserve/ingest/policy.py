"""What ingest does when a series is not a clean, regular stack.

Each problem has a named choice: ``reject`` raises the matching :class:`StudyError`
with the reason; the other choices proceed and record a warning on the loaded series.
The defaults refuse anything that would silently put voxels in the wrong place.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from typing import Literal, get_args, get_type_hints

GapChoice = Literal["reject", "flag", "resample"]
TiltChoice = Literal["reject", "flag", "correct"]
DuplicateChoice = Literal["reject", "drop_identical", "keep_first"]
SplitChoice = Literal["split", "reject"]
LocalizerChoice = Literal["drop", "reject"]


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
            broken header cannot ask for an allocation the host cannot make.
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
    max_voxels: int = 2**31

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
