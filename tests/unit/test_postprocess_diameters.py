"""RECIST axial diameters: spheres and rotated ellipses at known (non-square) spacing."""

from __future__ import annotations

import numpy as np
import pytest
from tests.factories.findings import ellipsoid, oblique_affine

from radserve.domain import Volume
from radserve.postprocess import axial_diameters


def _rotated_ellipse(spacing: float, a_mm: float, b_mm: float, degrees: float) -> np.ndarray:
    n = int(2.6 * a_mm / spacing)
    yy, xx = (np.mgrid[:n, :n] - n / 2) * spacing
    t = np.deg2rad(degrees)
    u = xx * np.cos(t) + yy * np.sin(t)
    v = -xx * np.sin(t) + yy * np.cos(t)
    return ((u / a_mm) ** 2 + (v / b_mm) ** 2 <= 1)[None]


@pytest.mark.parametrize("spacing", [(2.0, 0.6, 0.9), (1.0, 0.7, 0.7), (3.0, 1.2, 0.5)])
def test_sphere_measures_its_diameter_on_the_central_slice(spacing) -> None:
    r = 10.0
    shape = tuple(int(2.6 * r / s) for s in spacing)
    centre = tuple(n / 2 for n in shape)
    mask = ellipsoid(shape, spacing, centre, (r, r, r))
    axes = axial_diameters(mask, Volume.from_geometry(mask, spacing=spacing).affine)
    assert axes.longest_diameter_mm == pytest.approx(2 * r, abs=1.0)
    assert axes.short_axis_mm == pytest.approx(2 * r, abs=1.0)
    assert abs(axes.slice_index - centre[0]) <= 1.0


def test_rotated_ellipse_long_and_short_axes() -> None:
    mask = _rotated_ellipse(0.7, 15.0, 6.0, 30.0)
    volume = Volume.from_geometry(mask, spacing=(1.0, 0.7, 0.7))
    axes = axial_diameters(mask, volume.affine)
    assert axes.longest_diameter_mm == pytest.approx(30.0, abs=0.8)
    assert axes.short_axis_mm == pytest.approx(12.0, abs=0.8)
    (r0, c0), (r1, c1) = axes.long_axis
    angle = np.degrees(np.arctan2(r1 - r0, c1 - c0)) % 180
    assert angle == pytest.approx(30.0, abs=3.0)


def test_endpoints_have_the_reported_lengths_and_are_perpendicular() -> None:
    mask = _rotated_ellipse(0.8, 12.0, 7.0, 65.0)
    affine = oblique_affine((2.0, 0.8, 0.8))
    axes = axial_diameters(mask, affine)
    long = np.subtract(*axes.long_axis_lps)
    short = np.subtract(*axes.short_axis_lps)
    assert np.linalg.norm(long) == pytest.approx(axes.longest_diameter_mm)
    assert np.linalg.norm(short) == pytest.approx(axes.short_axis_mm)
    assert abs(long @ short) < 1e-6
    # an oblique, flipped affine with the same spacing gives the same lengths
    straight = axial_diameters(mask, Volume.from_geometry(mask, spacing=(2.0, 0.8, 0.8)).affine)
    assert axes.longest_diameter_mm == pytest.approx(straight.longest_diameter_mm)
    assert axes.short_axis_mm == pytest.approx(straight.short_axis_mm)


def test_non_square_pixels_are_measured_in_millimetres() -> None:
    mask = np.zeros((1, 5, 30), bool)
    mask[0, 2, 5:25] = True  # 20 columns
    axes = axial_diameters(mask, Volume.from_geometry(mask, spacing=(1.0, 2.0, 0.5)).affine)
    assert axes.longest_diameter_mm == pytest.approx(10.0)
    assert axes.short_axis_mm == pytest.approx(2.0)  # one pixel tall


def test_single_voxel_measures_one_pixel() -> None:
    mask = np.zeros((3, 3, 3), bool)
    mask[1, 1, 1] = True
    axes = axial_diameters(mask, Volume.from_geometry(mask, spacing=(1.0, 0.6, 0.6)).affine)
    assert axes.longest_diameter_mm == pytest.approx(0.6)
    assert axes.short_axis_mm == pytest.approx(0.6)
    assert axes.slice_index == 1


def test_key_slice_is_the_one_with_the_longest_diameter() -> None:
    mask = np.zeros((4, 20, 20), bool)
    mask[0, 5:10, 5:10] = True
    mask[1, 2:18, 8:12] = True
    mask[2, 5:12, 5:12] = True
    axes = axial_diameters(mask, np.eye(4), offset=(10, 0, 0))
    assert axes.slice_index == 11
