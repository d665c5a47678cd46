"""``input.spacing[0]: null`` (keep the native slice spacing), one rule in one place:
allowed on radserve's own grid (no resampling, default axes) and on nnU-Net's
(``resampling.grid: field_of_view``), refused on MONAI's ``first_voxel`` grid and with
patient-direction or reordered axes that have no resampling."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from radserve.models.manifest import InputSpec

FOV = {"grid": "field_of_view"}
FIRST_VOXEL = {"grid": "first_voxel"}
CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "radserve's grid": ({}, True),
    "nnU-Net's grid": ({"resampling": FOV}, True),
    "nnU-Net's grid, reordered axes": ({"resampling": FOV, "axes": ["x", "y", "z"]}, True),
    "MONAI's grid": ({"resampling": FIRST_VOXEL}, False),
    "MONAI's grid, patient axes": ({"resampling": FIRST_VOXEL, "axes": ["R", "A", "S"]}, False),
    "patient axes, no resampling": ({"axes": ["R", "A", "S"]}, False),
    "reordered axes, no resampling": ({"axes": ["x", "y", "z"]}, False),
}


def _input(spacing: tuple[float | None, float, float], **options: Any) -> InputSpec:
    return InputSpec.model_validate(
        {
            "mode": "3d",
            "patch_size": [16, 32, 32],
            "spacing": spacing,
            "normalisation": {"kind": "ct_window", "center": 40, "width": 400},
            **options,
        }
    )


@pytest.mark.parametrize("case", list(CASES))
def test_a_null_slice_spacing_is_kept_only_where_a_native_spacing_exists(case: str) -> None:
    options, allowed = CASES[case]
    if allowed:
        assert _input((None, 1.0, 1.0), **options).spacing[0] is None
    else:
        with pytest.raises(ValidationError, match=r"input.spacing\[0\] null .* needs nnU-Net's"):
            _input((None, 1.0, 1.0), **options)
    assert _input((2.0, 1.0, 1.0), **options).spacing == (2.0, 1.0, 1.0)  # given: always fine
