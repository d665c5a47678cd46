"""The vocabulary of ``input.axes`` (which way a network's axes run) and its validation.

The views that apply it to a volume are :mod:`radserve.preprocess.axes`.
"""

from __future__ import annotations

INDEX_AXES: tuple[str, str, str] = ("z", "y", "x")
DEFAULT_AXES = INDEX_AXES  # a 3d model's, when it declares none
# A 2d/2.5d model's, when it declares none: an axial slice as DICOM shows a supine
# head-first patient (rows towards posterior, columns towards the patient's left), the
# slices in order towards the head. A study stored otherwise (prone, feet first, rows and
# columns swapped, a NIfTI in RAS) is turned to it for the network and back.
SLICE_AXES: tuple[str, str, str] = ("S", "P", "L")
# Patient direction -> (LPS world axis, sign): radserve's affines map to DICOM LPS.
DIRECTIONS: dict[str, tuple[int, int]] = {
    "L": (0, 1),
    "R": (0, -1),
    "P": (1, 1),
    "A": (1, -1),
    "S": (2, 1),
    "I": (2, -1),
}


def check_axes(axes: tuple[str, ...]) -> tuple[str, str, str]:
    """``axes`` if it is a valid declaration, else a ValueError that says what is."""
    hint = (
        "input.axes names the network's three axes: a permutation of the index axes "
        "z (slice), y (row), x (column), e.g. [x, y, z], or three patient directions "
        "(MONAI Orientation axcodes), one of R/L, A/P, S/I each, e.g. [R, A, S]"
    )
    if len(axes) != 3:
        raise ValueError(f"{hint}; got {list(axes)}")
    if set(axes) <= set(INDEX_AXES):
        if len(set(axes)) != 3:
            raise ValueError(f"{hint}; got {list(axes)} (an index axis repeats)")
        return tuple(axes)  # type: ignore[return-value]
    if set(axes) <= set(DIRECTIONS):
        world = [DIRECTIONS[a][0] for a in axes]
        if len(set(world)) != 3:
            raise ValueError(f"{hint}; got {list(axes)} (two letters on one patient axis)")
        return tuple(axes)  # type: ignore[return-value]
    bad = [a for a in axes if a not in INDEX_AXES and a not in DIRECTIONS]
    raise ValueError(
        f"{hint}; got {list(axes)}"
        + (f" ({bad} are neither)" if bad else " (index axes and directions mixed)")
    )


__all__ = ["DEFAULT_AXES", "DIRECTIONS", "INDEX_AXES", "SLICE_AXES", "check_axes"]
