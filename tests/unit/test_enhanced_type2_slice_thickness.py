"""A conformant Enhanced CT is not flagged for a Slice Thickness its IOD keeps elsewhere.

An Enhanced (functional-group) instance gives Slice Thickness in its Pixel Measures
functional group; its IOD has no Image Plane module, so the attribute is absent at the
top level by design. Ingest flagged every such study "Type 2 attributes absent from the
source headers (DICOM SEG/SR carry them empty): SliceThickness", a warning in every
Enhanced CT report (STOW-RS of a 12-frame Enhanced CT, operator trial 2026-12-07).
"""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from tests.factories.dicom_series import make_enhanced_series

from radserve.ingest import discover_series, load_series


def _type2_warnings(folder: Path) -> list[str]:
    (header,) = discover_series(folder)
    return [w for w in load_series(header, workers=1).warnings if "Type 2" in w]


@pytest.mark.parametrize("modality", ["CT", "MR"])
def test_slice_thickness_in_the_pixel_measures_group_is_not_absent(
    tmp_path: Path, modality: str
) -> None:
    path = make_enhanced_series(tmp_path, n_frames=8, rows=16, cols=16, modality=modality)
    assert "SliceThickness" not in pydicom.dcmread(path, stop_before_pixels=True)
    assert _type2_warnings(tmp_path) == []


def test_an_enhanced_instance_without_any_slice_thickness_is_still_flagged(
    tmp_path: Path,
) -> None:
    path = make_enhanced_series(tmp_path, n_frames=8, rows=16, cols=16)
    ds = pydicom.dcmread(path)
    del ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].SliceThickness
    del ds.PatientID
    ds.save_as(path, enforce_file_format=True)
    (warning,) = _type2_warnings(tmp_path)
    assert "SliceThickness" in warning and "PatientID" in warning
