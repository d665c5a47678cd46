"""Hostile studies whose damage takes one slice out of the stack: the gap it leaves is
reported with why that slice is not in it (split off for other Rows/Columns, Pixel
Spacing or orientation, or skipped for a header nested too deep to read), not as a bare
"missing slices" that sends the sender looking for a slice never lost. Found by sending
hand-built hostile studies through ingest (session 18, helper "hostile")."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from tests.factories.dicom_series import make_ct_series
from tests.factories.hostile import nest_sequences, private_elements

from radserve.errors import GeometryError
from radserve.gateway.dicomweb.stow import DICOM_MEDIA, StowPart, check_part
from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.ingest.headers import UnreadableHeaderError, read_header, read_stream
from radserve.ingest.sources import SourceFile

NESTED = "unreadable DICOM header (RecursionError: sequences nested too deeply to read)"


def _other_size(ds: Dataset) -> None:
    ds.Rows = 20
    ds.PixelData = np.full((20, ds.Columns), 1000, "<u2").tobytes()


def _classic(edit: Callable[[Dataset], None]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        path = make_ct_series(folder, n_slices=8, rows=16, cols=12)[5]
        ds = pydicom.dcmread(path)
        edit(ds)
        ds.save_as(path, enforce_file_format=True)

    return write


def _nested(folder: Path) -> None:
    nest_sequences(make_ct_series(folder, n_slices=8, rows=16, cols=12)[5], 10_000)


@pytest.mark.parametrize(
    ("write", "why"),
    [
        pytest.param(
            _classic(_other_size),
            "series also holds 1 frames with other Rows/Columns (20×12), split off as part 1",
            id="rows-differ",
        ),
        pytest.param(
            _classic(lambda ds: setattr(ds, "PixelSpacing", [0.5, 0.5])),
            "series also holds 1 frames with other Pixel Spacing, split off as part 1",
            id="pixel-spacing-differs",
        ),
        pytest.param(
            _nested,
            f"1 file(s) of the input were skipped, unreadable: {NESTED}",
            id="sequences-nested-10000-deep",
        ),
    ],
)
def test_the_gap_a_damaged_slice_leaves_names_the_damage(
    tmp_path: Path, write: Callable[[Path], None], why: str
) -> None:
    write(tmp_path)
    with pytest.raises(GeometryError, match="missing slices: 1 gaps") as info:
        load_series(discover_series(tmp_path)[0])
    assert info.value.code == "geometry_invalid"
    assert why in info.value.message
    assert "\n" not in info.value.message


def test_a_header_nested_too_deep_is_named_at_each_door(tmp_path: Path) -> None:
    """STOW-RS refuses the part and C-STORE's header read the file with the reason, not
    a bare exception type; the other slices of the study are unaffected."""
    paths = make_ct_series(tmp_path, n_slices=3, rows=16, cols=12)
    nest_sequences(paths[1], 10_000)
    outcome = check_part(
        1, StowPart(DICOM_MEDIA, io.BytesIO(paths[1].read_bytes())), None, policy=IngestPolicy()
    )
    assert not outcome.stored
    assert "sequences nested too deeply to read" in outcome.reason
    with pytest.raises(UnreadableHeaderError, match="sequences nested too deeply"):
        read_header(paths[1])
    assert check_part(
        2, StowPart(DICOM_MEDIA, io.BytesIO(paths[0].read_bytes())), None, policy=IngestPolicy()
    ).stored


@pytest.mark.parametrize(
    ("rows", "cols", "spacing"),
    [(1, 1, (0.5, 1.0, 1.0)), (1, 4096, (2.0, 0.1, 0.1)), (7, 64, (2.0, 1.0, 1.0))],
)
def test_images_too_small_for_a_volume_are_refused_for_it(
    tmp_path: Path, rows: int, cols: int, spacing: tuple[float, float, float]
) -> None:
    """Session 18: 2,000 slices of 1 × 1 pixels (a 1 mm column, 1,000 mm long) passed
    every bound, and the test pipeline reported a lesion in them."""
    make_ct_series(tmp_path, n_slices=20, rows=rows, cols=cols, spacing=spacing)
    header = discover_series(tmp_path)[0]
    with pytest.raises(GeometryError, match=rf"images are {rows} × {cols} pixels") as info:
        load_series(header)
    assert "ingest.min_matrix=8" in info.value.message
    assert load_series(header, IngestPolicy(min_matrix=1)).volume.array.shape == (20, rows, cols)


def test_a_header_of_too_many_elements_is_refused_at_each_door(tmp_path: Path) -> None:
    """Session 18: 1,000,000 private elements of 2 bytes (10 MB, within max_header_bytes)
    cost 764 MB of RSS at the STOW-RS check and 364 MB at discovery; each element is
    now counted against ingest.max_header_elements (here lowered to keep the file small)."""
    paths = make_ct_series(tmp_path, n_slices=3, rows=16, cols=12)
    private_elements(paths[1], 3000)
    policy = IngestPolicy(max_header_elements=2000)
    bound = "more than 2000 data elements, more than ingest.max_header_elements"
    with pytest.raises(UnreadableHeaderError, match=bound):  # C-STORE's and STOW-RS's read
        read_header(io.BytesIO(paths[1].read_bytes()), max_header_elements=2000)
    read_header(io.BytesIO(paths[0].read_bytes()), max_header_elements=2000)  # a plain one
    (header,) = discover_series(tmp_path, policy=policy)
    assert [s.reason for s in header.skipped] == [
        f"header not read: the header holds {bound} (each costs memory whatever its size)"
    ]
    stow = check_part(1, StowPart(DICOM_MEDIA, io.BytesIO(paths[1].read_bytes())), None)
    assert stow.stored  # the default bound (500,000) is far above 3,000


def _traced_peak(read: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_stow_check_builds_only_the_attributes_it_reads(tmp_path: Path) -> None:
    """Session 18: the STOW-RS check built the whole header as a Dataset, then ingest's
    read built it again (100,000 private elements: +79 MB where ingest alone took +39).
    Its peak is now ingest's read's, not twice it (Python allocations, tracemalloc)."""
    path = make_ct_series(tmp_path, n_slices=1, rows=16, cols=12)[0]
    private_elements(path, 20_000)
    data = path.read_bytes()
    policy = IngestPolicy()

    def stow() -> None:
        assert check_part(1, StowPart(DICOM_MEDIA, io.BytesIO(data)), None, policy=policy).stored

    def ingest() -> None:
        read_stream(io.BytesIO(data), len(data), SourceFile(path), policy)

    stow()  # imports and caches first
    assert _traced_peak(stow) < 1.3 * _traced_peak(ingest)
