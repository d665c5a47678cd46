"""NIfTI round trips: array, affine and patient points survive save → load."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from tests.factories.dicom_series import make_ct_series, oblique_orientation, ramp_hu

from radserve.domain.volume import Volume
from radserve.errors import StudyError
from radserve.ingest import discover_series, load_nifti, load_series, save_nifti


def _oblique_volume(dtype: type) -> Volume:
    orientation = oblique_orientation(30.0, (1, -2, 0.5))
    row_dir, col_dir = np.array(orientation[:3]), np.array(orientation[3:])
    direction = np.stack([np.cross(row_dir, col_dir), col_dir, row_dir], axis=1)
    return Volume.from_geometry(
        ramp_hu(5, 7, 6).astype(dtype),
        spacing=(2.5, 0.8, 1.1),
        origin=(10.0, -20.0, 30.0),
        direction=direction,
    )


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
@pytest.mark.parametrize("dtype", [np.int16, np.float32])
def test_round_trip_oblique(tmp_path: Path, suffix: str, dtype: type) -> None:
    volume = _oblique_volume(dtype)
    path = tmp_path / f"vol{suffix}"
    save_nifti(volume, path)
    back = load_nifti(path)
    assert back.array.dtype == dtype
    np.testing.assert_array_equal(back.array, volume.array)
    np.testing.assert_allclose(back.affine, volume.affine, atol=1e-5)
    point = volume.index_to_patient([3, 2, 4])
    np.testing.assert_allclose(back.patient_to_index(point), [[3, 2, 4]], atol=1e-4)


def test_dicom_to_nifti_matches_nibabel_world_space(tmp_path: Path) -> None:
    """The saved file puts voxel (i, j, k) = (column, row, slice) at the RAS point."""
    make_ct_series(tmp_path / "dcm", orientation=oblique_orientation(20.0), order="shuffled")
    volume = load_series(discover_series(tmp_path / "dcm")[0]).volume
    save_nifti(volume, tmp_path / "ct.nii.gz")
    image = nib.load(tmp_path / "ct.nii.gz")
    lps = volume.index_to_patient([2, 5, 7])[0]
    ras = nib.affines.apply_affine(image.affine, [7, 5, 2])
    np.testing.assert_allclose(ras, lps * [-1, -1, 1], atol=1e-4)
    assert np.asanyarray(image.dataobj)[7, 5, 2] == volume.array[2, 5, 7]
    assert image.header.get_sform(coded=True)[1] == 1  # scanner


def test_scaled_integer_nifti_loads_as_int16(tmp_path: Path) -> None:
    data = (np.arange(60).reshape(5, 4, 3) % 50).astype(np.int16)
    image = nib.Nifti1Image(data, np.diag([0.5, 0.5, 2.0, 1.0]))
    image.header.set_slope_inter(2.0, -1024.0)
    nib.save(image, tmp_path / "scaled.nii")
    volume = load_nifti(tmp_path / "scaled.nii")
    assert volume.array.dtype == np.int16
    np.testing.assert_array_equal(volume.array, np.transpose(data, (2, 1, 0)) * 2 - 1024)


def test_trailing_singleton_axis_and_bad_files(tmp_path: Path) -> None:
    nib.save(nib.Nifti1Image(np.zeros((4, 3, 2, 1), np.int16), np.eye(4)), tmp_path / "4d.nii")
    assert load_nifti(tmp_path / "4d.nii").shape == (2, 3, 4)
    nib.save(nib.Nifti1Image(np.zeros((4, 3, 2, 2), np.int16), np.eye(4)), tmp_path / "t.nii")
    with pytest.raises(StudyError, match="must be 3-D"):
        load_nifti(tmp_path / "t.nii")
    (tmp_path / "junk.nii").write_bytes(b"not nifti")
    with pytest.raises(StudyError, match="not a readable NIfTI") as info:
        load_nifti(tmp_path / "junk.nii")
    assert info.value.code == "nifti_invalid"


def test_round_trip_sheared_affine(tmp_path: Path) -> None:
    """A tilted stack kept with gantry_tilt='flag' has a non-orthogonal affine."""
    affine = np.eye(4)
    affine[:3, :3] = [[0.0, 0.0, 0.9], [0.5, 0.7, 0.0], [2.0, 0.0, 0.0]]
    volume = Volume(ramp_hu(4, 5, 6).astype(np.int16), affine)
    save_nifti(volume, tmp_path / "sheared.nii")
    back = load_nifti(tmp_path / "sheared.nii")
    np.testing.assert_allclose(back.affine, affine, atol=1e-6)
    np.testing.assert_array_equal(back.array, volume.array)
