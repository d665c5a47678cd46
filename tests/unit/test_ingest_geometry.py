"""Stack geometry: sorting, orientation, spacing, tilt — on tiny synthetic series."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from tests.factories.dicom_series import (
    CORONAL,
    SAGITTAL,
    make_ct_series,
    oblique_orientation,
    ramp_hu,
    series_affine,
)

from radserve.errors import GeometryError
from radserve.ingest import IngestPolicy, LoadedSeries, discover_series, load_series
from radserve.ingest.geometry import _axes, slice_normal


def _load(folder: Path, **policy: str) -> LoadedSeries:
    (header,) = discover_series(folder)
    return load_series(header, IngestPolicy(**policy))


def _assert_slices_at_their_positions(loaded: LoadedSeries) -> None:
    """Every volume slice's first voxel maps to its source instance's IPP."""
    for k, src in enumerate(loaded.source_slices):
        ipp = [float(v) for v in pydicom.dcmread(src.source.path).ImagePositionPatient]
        np.testing.assert_allclose(loaded.volume.index_to_patient([k, 0, 0])[0], ipp, atol=1e-4)


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled"])
def test_slices_sorted_by_position_not_instance_number(tmp_path: Path, order: str) -> None:
    make_ct_series(tmp_path, order=order, seed=3)
    loaded = _load(tmp_path)
    np.testing.assert_array_equal(loaded.volume.array, ramp_hu(8, 16, 12))
    np.testing.assert_allclose(loaded.volume.affine, series_affine(), atol=1e-6)
    _assert_slices_at_their_positions(loaded)
    assert loaded.volume.array.dtype == np.int16
    assert loaded.warnings == ()


def test_non_square_pixels_not_swapped(tmp_path: Path) -> None:
    orientation = oblique_orientation(25.0)
    make_ct_series(tmp_path, spacing=(3.0, 0.5, 1.25), orientation=orientation)
    vol = _load(tmp_path).volume
    row_dir, col_dir = np.array(orientation[:3]), np.array(orientation[3:])
    one_row = vol.index_to_patient([0, 1, 0])[0] - vol.origin
    one_col = vol.index_to_patient([0, 0, 1])[0] - vol.origin
    np.testing.assert_allclose(one_row, 0.5 * col_dir, atol=1e-6)  # Pixel Spacing[0]
    np.testing.assert_allclose(one_col, 1.25 * row_dir, atol=1e-6)  # Pixel Spacing[1]
    assert vol.spacing == pytest.approx((3.0, 0.5, 1.25))


@pytest.mark.parametrize(
    "orientation",
    [CORONAL, SAGITTAL, (-1.0, 0.0, 0.0, 0.0, -1.0, 0.0), oblique_orientation(33.0, (1, 2, 3))],
    ids=["coronal", "sagittal", "flipped-axial", "oblique"],
)
def test_orientations_give_the_written_geometry(tmp_path: Path, orientation: tuple) -> None:
    origin = (-10.0, 20.0, 35.0)
    make_ct_series(tmp_path, orientation=orientation, origin=origin, order="descending")
    loaded = _load(tmp_path)
    expected = series_affine(orientation=orientation, origin=origin)
    np.testing.assert_allclose(loaded.volume.affine, expected, atol=1e-5)
    np.testing.assert_array_equal(loaded.volume.array, ramp_hu(8, 16, 12))
    _assert_slices_at_their_positions(loaded)


def test_content_follows_patient_space(tmp_path: Path) -> None:
    """A value defined in LPS lands where the affine says, whatever the orientation."""

    def field(points: np.ndarray) -> np.ndarray:
        return np.round(points @ np.array([3.0, -2.0, 5.0]))

    make_ct_series(tmp_path, orientation=oblique_orientation(40.0), hu=field, order="shuffled")
    vol = _load(tmp_path).volume
    idx = np.array([[0, 0, 0], [7, 15, 11], [3, 8, 2]])
    np.testing.assert_array_equal(vol.array[tuple(idx.T)], field(vol.index_to_patient(idx)))


def _offsets(gaps: list[float]) -> list[float]:
    return list(np.concatenate([[0.0], np.cumsum(gaps)]))


def test_missing_slice_rejected_by_default(tmp_path: Path) -> None:
    make_ct_series(tmp_path, drop=[4])
    with pytest.raises(GeometryError, match=r"missing slices: 1 gaps of 4\.00 mm.*median"):
        _load(tmp_path)


def test_missing_slice_flagged(tmp_path: Path) -> None:
    make_ct_series(tmp_path, drop=[4])
    loaded = _load(tmp_path, missing_slices="flag")
    assert loaded.volume.shape == (7, 16, 12)
    assert any("missing slices" in w and "approximate" in w for w in loaded.warnings)


def test_missing_slice_resampled(tmp_path: Path) -> None:
    make_ct_series(tmp_path, drop=[4])
    loaded = _load(tmp_path, missing_slices="resample")
    vol, hu = loaded.volume, ramp_hu(8, 16, 12)
    assert vol.shape == (8, 16, 12) and vol.array.dtype == np.int16
    np.testing.assert_array_equal(vol.array[[0, 3, 5, 7]], hu[[0, 3, 5, 7]])
    np.testing.assert_array_equal(vol.array[4], np.rint((hu[3] + hu[5]) / 2))
    np.testing.assert_allclose(vol.affine, series_affine(), atol=1e-6)
    assert loaded.source_slices == () and vol.source_sop_instance_uids == ()


def test_nonuniform_spacing(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=6, slice_offsets=_offsets([2.0, 2.0, 2.6, 2.0, 2.0]))
    with pytest.raises(GeometryError, match=r"non-uniform slice spacing: 1 gaps of 2\.60 mm"):
        _load(tmp_path)
    flagged = _load(tmp_path, nonuniform_spacing="flag")
    assert flagged.volume.spacing[0] == pytest.approx(10.6 / 5)
    resampled = _load(tmp_path, nonuniform_spacing="resample")
    assert resampled.volume.spacing[0] == pytest.approx(2.0)
    assert resampled.volume.shape[0] == 6  # round(10.6 / 2) + 1


def test_small_jitter_is_tolerated(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=5, slice_offsets=[0.0, 2.001, 3.999, 6.0, 8.002])
    assert _load(tmp_path).warnings == ()


def test_gantry_tilt_rejected_by_default(tmp_path: Path) -> None:
    make_ct_series(tmp_path, tilt_deg=15.0)
    with pytest.raises(GeometryError, match=r"gantry tilt.*15\.00° from the slice normal"):
        _load(tmp_path)


def test_gantry_tilt_flag_keeps_exact_sheared_affine(tmp_path: Path) -> None:
    make_ct_series(tmp_path, tilt_deg=15.0, order="shuffled")
    loaded = _load(tmp_path, gantry_tilt="flag")
    _assert_slices_at_their_positions(loaded)
    np.testing.assert_array_equal(loaded.volume.array, ramp_hu(8, 16, 12))
    assert "sheared" in loaded.warnings[0]


def test_gantry_tilt_corrected_onto_orthogonal_grid(tmp_path: Path) -> None:
    def field(points: np.ndarray) -> np.ndarray:  # linear, so interpolation is exact
        return points @ np.array([2.0, 10.0, 3.0])

    make_ct_series(tmp_path, tilt_deg=10.0, hu=field, spacing=(2.0, 1.0, 1.0), rows=24)
    vol = _load(tmp_path, gantry_tilt="correct").volume
    np.testing.assert_allclose(vol.affine, series_affine(spacing=(2.0, 1.0, 1.0)), atol=1e-6)
    # Interior voxels (shifted by < 2 rows) hold the field at their patient position.
    idx = np.array([[k, r, c] for k in range(8) for r in range(3, 20, 4) for c in (0, 5, 11)])
    expected = np.rint(field(vol.index_to_patient(idx)))
    np.testing.assert_allclose(vol.array[tuple(idx.T)], expected, atol=1)


def test_duplicate_identical_slice_is_dropped(tmp_path: Path) -> None:
    make_ct_series(tmp_path, duplicate=[2, 5])
    loaded = _load(tmp_path)
    np.testing.assert_array_equal(loaded.volume.array, ramp_hu(8, 16, 12))
    assert "dropped 2 identical duplicate slices" in loaded.warnings


def test_duplicate_with_other_pixels_is_rejected(tmp_path: Path) -> None:
    make_ct_series(tmp_path, duplicate=[3], duplicate_offset_hu=50.0)
    with pytest.raises(GeometryError, match="duplicate positions hold different pixel data"):
        _load(tmp_path)
    assert _load(tmp_path, duplicate_positions="keep_first").volume.shape == (8, 16, 12)
    with pytest.raises(GeometryError, match="share their position"):
        _load(tmp_path, duplicate_positions="reject")


def test_single_slice_uses_slice_thickness(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=1, spacing=(5.0, 0.7, 0.9))
    loaded = _load(tmp_path)
    assert loaded.volume.spacing == pytest.approx((5.0, 0.7, 0.9))
    assert "Slice Thickness" in loaded.warnings[0]


def test_policy_rejects_unknown_choice_with_suggestion() -> None:
    with pytest.raises(ValueError, match="did you mean 'resample'"):
        IngestPolicy(missing_slices="resampel")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "orientation",
    [(1, 0, 0, 0, 1, 0), CORONAL, SAGITTAL, oblique_orientation(17.0), (0.6, 0.8, 0, 0, 0, 1)],
)
def test_one_slice_normal_for_the_split_and_the_stack_plan(orientation: tuple) -> None:
    """discover's split and plan_stack's axes share slice_normal: the unit row × column
    (the cross product discover and geometry each computed before)."""
    row, col = np.array(orientation[:3], float), np.array(orientation[3:], float)
    expected = np.cross(row, col) / np.linalg.norm(np.cross(row, col))
    np.testing.assert_allclose(slice_normal(orientation), expected, atol=1e-12)
    _, _, normal = _axes(orientation)
    np.testing.assert_allclose(normal, expected, atol=1e-12)


@pytest.mark.parametrize(
    "orientation",
    [None, (1, 0, 0, 0, 1), (1, 0, 0, 1, 0, 0), (0, 0, 0, 0, 1, 0), (1, 0, 0, 0, float("nan"), 0)],
)
def test_no_slice_normal_without_two_crossing_vectors(orientation: tuple | None) -> None:
    assert slice_normal(orientation) is None
