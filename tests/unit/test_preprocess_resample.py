"""Resampling keeps patient geometry: a point stays where it is in millimetres."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from radserve.domain.volume import Volume
from radserve.preprocess import (
    grid_coordinates,
    resample_inplane,
    resample_to_spacing,
    resampled_size,
)


def _oblique_direction() -> np.ndarray:
    a = np.deg2rad(20)
    rot = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    return rot @ np.eye(3)[:, ::-1]


@pytest.mark.parametrize("direction", [None, "oblique"])
def test_bright_voxel_keeps_its_patient_position(direction: str | None) -> None:
    d = _oblique_direction() if direction else None
    array = np.zeros((3, 37, 53), np.float32)
    array[1, 20, 31] = 1000.0
    vol = Volume.from_geometry(array, spacing=(2.5, 0.7, 0.9), origin=(-10, 5, 30), direction=d)
    p = vol.index_to_patient(np.array([1, 20, 31]))

    out = resample_inplane(vol, (1.5, 1.5), order=1)

    assert out.shape == (3, resampled_size(37, 0.7, 1.5), resampled_size(53, 0.9, 1.5))
    assert out.shape == (3, 17, 32)
    assert out.array.dtype == np.float32
    # The intensity-weighted centroid of the blurred spot maps back to P.
    com = np.array(ndimage.center_of_mass(out.array))
    q = out.index_to_patient(com)
    assert np.linalg.norm(q - p) < 0.5 * 1.5
    # Slices are untouched; directions kept; spacing is the extent-preserving one.
    np.testing.assert_allclose(out.direction, vol.direction, atol=1e-9)
    np.testing.assert_allclose(out.spacing, (2.5, 37 * 0.7 / 17, 53 * 0.9 / 32))


def test_field_of_view_edges_line_up() -> None:
    vol = Volume.from_geometry(np.zeros((2, 37, 53), np.int16), spacing=(3.0, 0.7, 0.9))
    out = resample_inplane(vol, (1.5, 1.5), order=0)
    # Patient position of the outer edge of voxel (0, 0) and (n-1, n-1) in-plane.
    lo_in = vol.index_to_patient(np.array([0, -0.5, -0.5]))
    lo_out = out.index_to_patient(np.array([0, -0.5, -0.5]))
    hi_in = vol.index_to_patient(np.array([0, 36.5, 52.5]))
    hi_out = out.index_to_patient(np.array([0, out.shape[1] - 0.5, out.shape[2] - 0.5]))
    np.testing.assert_allclose(lo_in, lo_out, atol=1e-9)
    np.testing.assert_allclose(hi_in, hi_out, atol=1e-9)


def test_labels_keep_their_values_with_nearest() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=(2, 37, 53)).astype(np.uint8) * 3
    vol = Volume.from_geometry(labels, spacing=(1.0, 0.7, 0.9))
    out = resample_inplane(vol, (1.1, 0.5), order=0)
    assert out.array.dtype == np.uint8
    assert set(np.unique(out.array)) <= {0, 3, 6, 9}


def test_matches_scipy_zoom_grid_mode() -> None:
    rng = np.random.default_rng(1)
    array = rng.normal(size=(2, 37, 53)).astype(np.float32)
    vol = Volume.from_geometry(array, spacing=(1.0, 0.7, 0.9))
    out = resample_inplane(vol, (1.5, 0.6), order=1)
    ref = ndimage.zoom(
        array.astype(np.float64),
        np.array(out.shape) / np.array(vol.shape),
        order=1,
        mode="nearest",
        grid_mode=True,
    )
    np.testing.assert_allclose(out.array, ref, atol=1e-5)


def test_round_trip_of_a_smooth_image_is_close() -> None:
    y, x = np.mgrid[0:37, 0:53]
    array = np.broadcast_to(np.sin(y / 6.0) + np.cos(x / 9.0), (3, 37, 53)).astype(np.float32)
    vol = Volume.from_geometry(array, spacing=(2.0, 0.7, 0.9))
    small = resample_inplane(vol, (1.5, 1.5), order=1)
    back = resample_inplane(small, vol.spacing[1:], order=1)
    assert back.shape == vol.shape
    np.testing.assert_allclose(back.affine, vol.affine, atol=1e-9)
    assert np.abs(back.array - array)[:, 2:-2, 2:-2].max() < 0.05


def test_resample_to_spacing_through_plane_and_none() -> None:
    vol = Volume.from_geometry(
        np.zeros((10, 8, 8), np.float32),
        spacing=(2.5, 1.0, 1.0),
        source_sop_instance_uids=tuple("abcdefghij"),
    )
    kept = resample_to_spacing(vol, (None, 2.0, 2.0), order=1)
    assert kept.shape == (10, 4, 4)
    assert kept.source_sop_instance_uids == vol.source_sop_instance_uids
    thin = resample_to_spacing(vol, (1.25, 1.0, 1.0), order=1)
    assert thin.shape == (20, 8, 8)
    assert thin.source_sop_instance_uids == ()
    np.testing.assert_allclose(thin.spacing, (1.25, 1.0, 1.0))


def test_grid_coordinates_inverse_is_the_same_formula() -> None:
    fwd = grid_coordinates(37, 17)  # new voxel -> old index
    inv = grid_coordinates(17, 37)  # old voxel -> new index
    # Composition is the identity on the old grid (affine maps; np.interp clamps the ends).
    np.testing.assert_allclose(
        np.interp(inv, np.arange(17), fwd)[1:-1], np.arange(37)[1:-1], atol=1e-9
    )
