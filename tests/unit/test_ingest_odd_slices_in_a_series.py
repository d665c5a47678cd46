"""Images of another kind between a series' slices are refused as such, and the refusal
gives the right diagnosis, never advice that would not help.

Session 41 trials: CT and MR instances alternating in one series were split by SOP Class
and the CT half ran with only a warning (interleaving by orientation, size or spacing was
refused since session 19, not by SOP Class or Modality); one slice of other Rows/Columns
failed as "missing slices ... set ingest.missing_slices: resample", and following that
advice only met the interleaving refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import SecondaryCaptureImageStorage
from tests.factories.dicom_series import make_ct_series, make_mr_series, new_uid

from radserve.errors import GeometryError
from radserve.ingest import IngestPolicy, discover_series, load_series

INTERLEAVES = "series interleaves images of another orientation, size, pixel spacing, SOP Class"


def _uids() -> dict[str, str]:
    return {"series_uid": new_uid(), "study_uid": new_uid(), "frame_of_reference_uid": new_uid()}


def test_ct_and_mr_images_alternating_in_one_series_are_refused(tmp_path: Path) -> None:
    uids = _uids()
    make_ct_series(tmp_path, n_slices=5, spacing=(4.0, 0.7, 0.9), **uids, prefix="ct")
    make_mr_series(
        tmp_path, n_slices=4, spacing=(4.0, 0.7, 0.9), origin=(0.0, 0.0, 2.0), **uids, prefix="mr"
    )
    parts = discover_series(tmp_path)
    assert [p.modality for p in parts] == ["CT", "MR"]
    for part in parts:
        assert {"sop_class", "interleaved"} <= part.split_reasons
        with pytest.raises(GeometryError, match=INTERLEAVES) as refused:
            load_series(part, required_modality=part.modality)
        assert "another SOP Class" in refused.value.message


def _secondary_capture(paths: list[Path], modality: str) -> None:
    for path in paths:
        ds = pydicom.dcmread(path)
        ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
        ds.Modality = modality
        ds.save_as(path, enforce_file_format=True)


def test_two_modalities_alternating_in_one_sop_class_are_refused(tmp_path: Path) -> None:
    """A class that does not fix the Modality (Secondary Capture): split by Modality."""
    uids = _uids()
    _secondary_capture(make_ct_series(tmp_path, n_slices=5, spacing=(4.0, 1, 1), **uids), "OT")
    other = make_ct_series(
        tmp_path, n_slices=4, spacing=(4.0, 1, 1), origin=(0, 0, 2.0), **uids, prefix="b"
    )
    _secondary_capture(other, "MR")
    parts = discover_series(tmp_path)
    assert [p.split_reasons for p in parts] == [{"modality", "interleaved"}] * 2
    with pytest.raises(GeometryError, match="another Modality"):
        load_series(parts[0])


def test_ct_and_mr_series_side_by_side_still_load(tmp_path: Path) -> None:
    """Not interleaved (the MR beyond the CT's slices): split off as before."""
    uids = _uids()
    make_ct_series(tmp_path, n_slices=5, **uids, prefix="ct")
    make_mr_series(tmp_path, n_slices=4, origin=(0.0, 0.0, 40.0), **uids, prefix="mr")
    ct, mr = discover_series(tmp_path)
    assert ct.split_reasons == {"sop_class"}
    assert load_series(ct).volume.shape[0] == 5
    assert load_series(mr).volume.shape[0] == 4


def test_one_slice_of_another_size_is_named_without_the_resampling_advice(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path, n_slices=8, rows=16, cols=12)
    ds = pydicom.dcmread(paths[5])
    ds.Rows = 20
    ds.PixelData = np.full((20, 12), 1000, "<u2").tobytes()
    ds.save_as(paths[5], enforce_file_format=True)
    for policy in (IngestPolicy(), IngestPolicy(missing_slices="resample")):
        with pytest.raises(GeometryError) as refused:
            load_series(discover_series(tmp_path)[0], policy)
        message = refused.value.message
        assert message.startswith(INTERLEAVES), message
        assert "series also holds 1 frames with other Rows/Columns (20×12)" in message
        assert "missing_slices" not in message and "RADSERVE_INGEST__" not in message
    with pytest.raises(GeometryError) as refused:
        load_series(discover_series(tmp_path)[0])
    assert "the stack without them: missing slices: 1 gaps of 4.00 mm" in refused.value.message
