"""Pixel format values that contradict each other are refused naming the attributes
(``instance_invalid``), at every door (ingest's header read is STOW-RS's part check too).

Session 41 trial "t-ingest": Bits Stored 0 was read as absent and Bits Allocated stood
in; High Bit was never read (0, or 15 with Bits Stored 12, ran as if it were 11; Bits
Stored 1 with High Bit 11 ran masked to one bit); a CT Image Storage instance (a
single-frame SOP Class) with Number of Frames 2 failed as "80 of 80 frames have no Image
Position (Patient)"."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset
from tests.factories.dicom_series import make_ct_series, make_mr_series

from radserve.errors import StudyError
from radserve.gateway.dicomweb.stow import DICOM_MEDIA, StowPart, check_part
from radserve.ingest import IngestPolicy, discover_series, load_series


def _edit(paths: list[Path], edit: Callable[[Dataset], None]) -> None:
    for path in paths:
        ds = pydicom.dcmread(path)
        edit(ds)
        ds.save_as(path, enforce_file_format=True)


def _set(**values: object) -> Callable[[Dataset], None]:
    def edit(ds: Dataset) -> None:
        for keyword, value in values.items():
            setattr(ds, keyword, value)

    return edit


def _two_frames(ds: Dataset) -> None:
    ds.NumberOfFrames = 2
    ds.PixelData = ds.PixelData + ds.PixelData


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_set(BitsStored=0), "Bits Stored 0 does not fit Bits Allocated 16"),
        (_set(HighBit=15), "High Bit 15 with Bits Stored 12"),
        (_set(HighBit=0), "High Bit 0 with Bits Stored 12"),
        (_set(BitsStored=1), "High Bit 11 with Bits Stored 1"),
        (_two_frames, "Number of Frames is 2 in an instance of CT Image Storage, a single-frame"),
    ],
    ids=["bits-stored-0", "high-bit-15", "high-bit-0", "bits-stored-1", "classic-ct-2-frames"],
)
def test_a_contradicting_pixel_format_is_refused_naming_the_attributes(
    tmp_path: Path, edit: Callable[[Dataset], None], says: str
) -> None:
    paths = make_ct_series(tmp_path, n_slices=6)
    _edit(paths, edit)
    (header,) = discover_series(tmp_path)
    with pytest.raises(StudyError) as refused:
        load_series(header)
    assert refused.value.code == "instance_invalid"
    assert refused.value.message.startswith("instance 1 (SOP Instance UID "), refused.value
    assert says in refused.value.message
    part = StowPart(DICOM_MEDIA, io.BytesIO(paths[0].read_bytes()))
    outcome = check_part(1, part, None, policy=IngestPolicy())
    assert not outcome.stored and says in outcome.reason


@pytest.mark.parametrize(
    "edit",
    [
        _set(HighBit=11),
        lambda ds: delattr(ds, "HighBit"),  # absent: the Bits Stored decide, as for pydicom
        _set(BitsStored=16, HighBit=15),
        _set(NumberOfFrames=1),  # a classic instance saying 1: tolerated
    ],
    ids=["consistent", "high-bit-absent", "bits-stored-16", "one-frame"],
)
def test_a_consistent_pixel_format_loads(tmp_path: Path, edit: Callable[[Dataset], None]) -> None:
    paths = make_ct_series(tmp_path, n_slices=6)
    _edit(paths, edit)
    assert load_series(discover_series(tmp_path)[0]).volume.shape[0] == 6


def test_an_mr_image_of_several_frames_is_refused_for_it(tmp_path: Path) -> None:
    paths = make_mr_series(tmp_path, n_slices=4)
    _edit(paths, _two_frames)
    with pytest.raises(StudyError, match="2 in an instance of MR Image Storage, a single-frame"):
        load_series(discover_series(tmp_path)[0])
