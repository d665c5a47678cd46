"""A NIfTI CT, MR or PET image wider in its plane than any scanner's field is refused on
its header, before a voxel is read, as a DICOM series is (``geometry_invalid``, the same
wording); ``ingest.max_in_plane_field_mm`` sets the bound for both doors.

User trial (2026-12-07): the bound (then the constant ``MAX_IN_PLANE_FIELD_MM``, 1000 mm)
applied to DICOM only. A NIfTI of 128 × 128 voxels of 19.5 mm (2,496 mm, within
``max_fov_mm``) loaded, and a model's 1.5 mm grid of it cost what the DICOM twin had
cost before the bound: 228 CPU-s and 1.8 GB for 100 slices of 3 MB.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from pydantic import ValidationError
from tests.factories.dicom_series import make_ct_series

from radserve.config import IngestSettings
from radserve.errors import GeometryError
from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.ingest.nifti import load_nifti

WIDE = (19.5, 19.5, 1.0)  # mm along i, j, k: 64 × 32 voxels span 1248 × 624 mm


def _nifti(path: Path, zooms: tuple[float, float, float] = WIDE, *, cut: bool = False) -> Path:
    """64 × 32 × 4 voxels (i, j, k) of CT values; ``cut``: the voxel data ends short of
    what the header declares, so that only a refusal on the header can come first."""
    data = np.full((64, 32, 4), 40, np.int16)
    nib.save(nib.Nifti1Image(data, np.diag([*zooms, 1.0])), path)
    if cut:
        path.write_bytes(path.read_bytes()[:-1000])
    return path


def test_a_nifti_wider_than_any_scanner_is_refused_on_its_header(tmp_path: Path) -> None:
    path = _nifti(tmp_path / "wide.nii", cut=True)
    with pytest.raises(GeometryError) as refused:
        load_nifti(path, policy=IngestPolicy(), modality="CT")
    assert refused.value.code == "geometry_invalid"
    assert refused.value.message == (
        "the NIfTI slices span 1248 × 624 mm in their plane (64 × 32 voxels along i × j of "
        "19.5\\19.5 mm), more than the 1000 mm of any CT scanner's field "
        "(ingest.max_in_plane_field_mm): the voxel size (the affine's or pixdim's) is not "
        "the image's (a damaged or rewritten header); correct it at the source"
    )


def test_the_dicom_and_nifti_refusals_say_the_same(tmp_path: Path) -> None:
    make_ct_series(tmp_path / "dicom", n_slices=4, rows=64, cols=32, spacing=(1.0, 19.5, 19.5))
    with pytest.raises(GeometryError) as dicom:
        load_series(discover_series(tmp_path / "dicom")[0])
    with pytest.raises(GeometryError) as nifti:
        load_nifti(_nifti(tmp_path / "wide.nii"), policy=IngestPolicy(), modality="CT")
    shared = [
        "mm in their plane",
        "more than the 1000 mm of any CT scanner's field (ingest.max_in_plane_field_mm)",
        "is not the image's (a damaged or rewritten header); correct it at the source",
    ]
    for words in shared:
        assert words in dicom.value.message and words in nifti.value.message, words


@pytest.mark.parametrize("modality", ["MR", "PT"])
def test_mr_and_pet_niftis_meet_the_bound_too(tmp_path: Path, modality: str) -> None:
    with pytest.raises(GeometryError, match=f"of any {modality} scanner's field"):
        load_nifti(_nifti(tmp_path / "wide.nii"), policy=IngestPolicy(), modality=modality)


def test_the_widest_field_a_scanner_reconstructs_loads(tmp_path: Path) -> None:
    """64 × 15.5 mm = 992 mm: within the 1000 mm."""
    path = _nifti(tmp_path / "ct.nii", (15.5, 15.5, 1.0))
    assert load_nifti(path, policy=IngestPolicy(), modality="CT").shape == (4, 32, 64)


def test_a_site_raises_the_bound_for_both_doors(tmp_path: Path) -> None:
    """A site whose images are wider (a large-animal bore, a phantom) sets
    ``ingest.max_in_plane_field_mm``; the settings build the policy both doors read."""
    policy = IngestPolicy.from_settings(IngestSettings(max_in_plane_field_mm=1300))
    wide = load_nifti(_nifti(tmp_path / "wide.nii"), policy=policy, modality="CT")
    assert wide.shape == (4, 32, 64)
    make_ct_series(tmp_path / "dicom", n_slices=4, rows=64, cols=32, spacing=(1.0, 19.5, 19.5))
    assert load_series(discover_series(tmp_path / "dicom")[0], policy).volume.shape == (4, 64, 32)
    with pytest.raises(GeometryError, match="more than the 1200 mm of any CT"):
        load_nifti(
            _nifti(tmp_path / "w.nii"),
            policy=IngestPolicy(max_in_plane_field_mm=1200),
            modality="CT",
        )
    with pytest.raises(ValidationError, match="max_in_plane_field_mm"):
        IngestSettings(max_in_plane_field_mm=0)
