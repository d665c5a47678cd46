"""One localizer check (ingest.sop_classes.is_localizer) for the four places that ask:
ingest's frames, series selection, channel matching and the gateway's late instances."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories.dicom_series import make_ct_series, make_localizer

from radserve.ingest import discover_series
from radserve.ingest.sop_classes import is_localizer
from radserve.models.manifest import ChannelSpec
from radserve.pipeline.channels import matches
from radserve.pipeline.selection import rejection_reason
from radserve.pipeline.spec import SeriesRules
from radserve.service.gateway import _never_input


@pytest.mark.parametrize(
    ("image_type", "expected"),
    [
        (("ORIGINAL", "PRIMARY", "LOCALIZER"), True),
        (("DERIVED", "SECONDARY", "localizer"), True),  # any case
        (["LOCALIZER "], True),  # padded
        (("ORIGINAL", "PRIMARY", "AXIAL"), False),
        ((), False),
    ],
)
def test_an_image_type_names_a_localizer_in_any_value(image_type: tuple, expected: bool) -> None:
    assert is_localizer(image_type) is expected


def test_a_localizer_is_never_an_input_wherever_it_is_asked(tmp_path: Path) -> None:
    scout = make_localizer(tmp_path / "scout", series_uid="1.2.826.0.1.3680043.10.9.1", n_images=4)
    volume = make_ct_series(tmp_path / "ct", series_uid="1.2.826.0.1.3680043.10.9.2")
    (header,) = discover_series(tmp_path / "scout")
    (ct,) = discover_series(tmp_path / "ct")
    assert all(f.is_localizer for f in header.frames) and header.is_localizer
    assert not any(f.is_localizer for f in ct.frames)
    rules = SeriesRules(exclude_image_types=(), min_slices=2)  # a pipeline that names none
    assert rejection_reason(header, rules) == "image type ['LOCALIZER'] is excluded"
    assert rejection_reason(ct, rules) is None
    channel = ChannelSpec(
        name="ct", modality="CT", normalisation={"kind": "ct_window", "center": 0, "width": 800}
    )
    assert not matches(header, channel) and matches(ct, channel)
    assert all(_never_input(p) for p in scout) and not any(_never_input(p) for p in volume)
