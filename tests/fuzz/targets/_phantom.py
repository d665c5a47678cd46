"""Seed DICOM for the targets: small phantom slices from the test factories, with fixed
study, series and frame-of-reference UIDs so a corpus kept from an earlier run still
belongs to the series :mod:`tests.fuzz.targets.series` builds around it."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    RLELossless,
)

from tests.factories.dicom_series import make_ct_series, make_enhanced_series

STUDY_UID = "1.2.826.0.1.3680043.8.498.1001"
SERIES_UID = "1.2.826.0.1.3680043.8.498.1002"
FRAME_UID = "1.2.826.0.1.3680043.8.498.1003"
SLICES = 4
MUTATED = 2  # the slice of a series the fuzzer's bytes replace
PARSER = (
    "pydicom.filereader",
    "pydicom.dataelem",
    "pydicom.dataset",
    "pydicom.values",
    "pydicom.valuerep",
    "pydicom.charset",
    "pydicom.encaps",
    "pydicom.filebase",
    "pydicom.multival",
    "pydicom.sequence",
)
"""pydicom's parsing modules: what most DICOM inputs exercise (its data dictionaries are
left out: instrumenting them costs seconds and finds nothing)."""


def _series(folder: Path, syntax: str) -> list[bytes]:
    paths = make_ct_series(
        folder,
        n_slices=SLICES,
        rows=16,
        cols=12,
        series_uid=SERIES_UID,
        study_uid=STUDY_UID,
        frame_of_reference_uid=FRAME_UID,
        transfer_syntax=syntax,
        prefix=syntax.replace(".", "_"),
    )
    return [p.read_bytes() for p in paths]


@functools.cache
def series_slices() -> tuple[bytes, ...]:
    """The 4 slices (Explicit VR Little Endian) of the series target, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        return tuple(_series(Path(tmp), ExplicitVRLittleEndian))


@functools.cache
def instances() -> tuple[bytes, ...]:
    """One slice of the series in each syntax the doors take natively or by plugin
    (implicit, explicit, deflated, RLE), an enhanced multi-frame CT, and a bare stream
    without preamble and File Meta (older scanners)."""
    out = [series_slices()[MUTATED]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for syntax in (ImplicitVRLittleEndian, DeflatedExplicitVRLittleEndian, RLELossless):
            out.append(_series(folder / syntax, syntax)[MUTATED])
        enhanced = make_enhanced_series(folder / "enhanced", n_frames=3, rows=8, cols=8)
        out.append(enhanced.read_bytes())
    implicit = out[1]
    meta_end = implicit.index(b"\x08\x00", 132 + 12)  # first data-set tag after the meta
    out.append(implicit[meta_end:])
    return tuple(out)


__all__ = [
    "FRAME_UID",
    "MUTATED",
    "PARSER",
    "SERIES_UID",
    "SLICES",
    "STUDY_UID",
    "instances",
    "series_slices",
]
