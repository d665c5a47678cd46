"""A CT, MR or PET image wider than any scanner's field in its plane is refused before a
pixel is decoded (``geometry_invalid``), naming its Rows, Columns and Pixel Spacing.

Session 41 trial "t-ingest": 100 slices of 128 x 128 with Pixel Spacing 19.5 mm (a
2,496 mm field, within ``ingest.max_fov_mm`` 2500, which bounds every axis) took 228 s
and 1.78 GB, resampled to the model's 1.5 mm (1664 x 1664 a slice)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tests.factories.dicom_series import make_ct_series, make_mr_series

from radserve.errors import GeometryError
from radserve.ingest import discover_series, load_series
from radserve.ingest.policy import IngestPolicy


@pytest.mark.parametrize("make", [make_ct_series, make_mr_series], ids=["CT", "MR"])
def test_an_image_wider_than_any_scanner_s_field_is_refused(
    tmp_path: Path, make: Callable[..., list[Path]]
) -> None:
    make(tmp_path, n_slices=4, rows=64, cols=32, spacing=(1.0, 19.5, 19.5))
    with pytest.raises(GeometryError) as refused:
        load_series(discover_series(tmp_path)[0])
    assert refused.value.code == "geometry_invalid"
    assert refused.value.message.startswith(
        "the images span 1248 × 624 mm in their plane (64 × 32 pixels of Pixel Spacing "
        "19.5\\19.5 mm), more than the 1000 mm of any"
    ), refused.value.message


def test_the_widest_field_a_scanner_reconstructs_loads(tmp_path: Path) -> None:
    """An 80-90 cm extended-field reconstruction of a wide-bore CT: 64 × 14 mm = 896 mm."""
    assert IngestPolicy().max_in_plane_field_mm == 1000
    make_ct_series(tmp_path, n_slices=4, rows=64, cols=64, spacing=(1.0, 14.0, 14.0))
    assert load_series(discover_series(tmp_path)[0]).volume.shape == (4, 64, 64)
