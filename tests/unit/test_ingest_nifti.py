"""NIfTI round trips: array, affine and patient points survive save → load."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from tests.factories.dicom_series import make_ct_series, oblique_orientation, ramp_hu

from radserve.domain.volume import Volume
from radserve.errors import StudyError
from radserve.ingest import IngestPolicy, discover_series, load_nifti, load_series, save_nifti


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


def _nifti(path: Path, data: np.ndarray, affine: np.ndarray) -> Path:
    nib.save(nib.Nifti1Image(data, affine), path)
    return path


def _truncated_nifti(path: Path, shape: tuple[int, int, int], dtype: type = np.float32) -> Path:
    """A header that claims ``shape`` voxels of ``dtype``, with none of them written: a
    few hundred bytes that would ask for gigabytes if the claim were read."""
    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(dtype)
    path.write_bytes(header.binaryblock + b"\0" * 4)
    return path


def test_a_nifti_from_outside_meets_the_bounds_of_a_dicom_series(tmp_path: Path) -> None:
    """Before, a NIfTI upload met none of the ingest bounds: 64³ voxels at 1 m spacing
    (a 3.4 KB .nii.gz) asked the model's resampling for a grid no memory holds and the
    OOM killer stopped the server; NaN voxels, 1e30 HU and complex data ran, an RGB
    image or a NaN in the affine failed as radserve's own error."""
    policy = IngestPolicy()
    body = np.full((64, 64, 24), -1000, np.int16)
    ramp = ramp_hu(24, 64, 64).astype(np.float32).transpose(2, 1, 0)

    def refused(data: np.ndarray, affine: np.ndarray, name: str) -> StudyError:
        path = _nifti(tmp_path / f"{name}.nii.gz", data, affine)
        with pytest.raises(StudyError) as info:
            load_nifti(path, policy=policy, modality="CT")
        return info.value

    metre = refused(body, np.diag([1000.0, 1000.0, 1000.0, 1.0]), "metre")
    assert metre.code == "geometry_invalid"
    assert "in-plane voxel size 1000\\1000 mm" in metre.message and "max_pixel" in metre.message
    thin = refused(body, np.diag([0.001, 0.001, 1.0, 1.0]), "thin")
    assert thin.code == "geometry_invalid" and "ingest.min_spacing_mm" in thin.message
    gaps = refused(body, np.diag([0.8, 0.8, 80.0, 1.0]), "gaps")
    assert gaps.code == "geometry_invalid" and "slice spacing 80 mm" in gaps.message
    wide = refused(np.zeros((512, 512, 2), np.int16), np.diag([10.0, 10.0, 1, 1]), "wide")
    assert wide.code == "geometry_invalid" and "ingest.max_fov_mm" in wide.message
    needle = refused(np.zeros((1, 1, 2000), np.int16), np.eye(4), "needle")
    assert needle.code == "geometry_invalid" and "ingest.min_matrix=8" in needle.message
    far = np.eye(4)
    far[:3, 3] = [1e9, 0.0, 0.0]
    assert "not a patient position" in refused(body, far, "far").message
    lost = np.eye(4)
    lost[0, 3] = np.nan
    assert refused(body, lost, "lost").code == "nifti_invalid"
    for name, values in (("nan", np.nan), ("inf", np.inf)):
        bad = ramp.copy()
        bad[3, 4, 5] = values
        error = refused(bad, np.eye(4), name)
        assert error.code == "implausible_pixel_values" and "1 of 98304" in error.message
    huge = refused(ramp * 1e26, np.eye(4), "huge")
    assert huge.code == "implausible_pixel_values" and "beyond any CT scale" in huge.message
    complex_data = refused(ramp.astype(np.complex64), np.eye(4), "complex")
    assert complex_data.code == "unsupported_pixel_format"
    rgb = np.zeros((64, 64, 24), [("R", "u1"), ("G", "u1"), ("B", "u1")])
    assert refused(rgb, np.eye(4), "rgb").code == "unsupported_pixel_format"
    # a header claiming 2³¹ voxels: refused on the claim, before any voxel is read
    claim = _truncated_nifti(tmp_path / "claim.nii", (2048, 2048, 512))
    with pytest.raises(StudyError) as info:
        load_nifti(claim, policy=policy)
    assert info.value.code == "series_too_large" and "2147483648 voxels" in info.value.message
    wide_type = _truncated_nifti(tmp_path / "f64.nii", (1024, 1024, 600), np.float64)
    with pytest.raises(StudyError) as info:
        load_nifti(wide_type, policy=policy)
    assert info.value.code == "series_too_large" and "ingest.max_file_bytes" in info.value.message
    # the same volumes with sane numbers are read, as CT or not
    assert load_nifti(_nifti(tmp_path / "ok.nii.gz", body, np.eye(4)), policy=policy).shape
    volume = load_nifti(_nifti(tmp_path / "mr.nii", ramp * 100, np.eye(4)), modality="MR")
    assert volume.array.dtype == np.float32
