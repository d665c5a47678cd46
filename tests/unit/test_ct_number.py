"""The CT-number calibration check (radserve.pipeline.ct_number, input_domain.fat_hu): a
study's fat peak is found where its generator put the fat, moves with a calibration
offset, survives low-dose noise, and is not confused with soft tissue's flank; a study
with no fat says so instead of guessing (issue 18)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.factories.torso import simple_torso

from radserve.domain.input_domain import (
    AcquisitionFacts,
    InputDomain,
    domain_unchecked,
    domain_violations,
)
from radserve.domain.volume import Volume
from radserve.evaluation.grid import GridCell, cell_phantom
from radserve.phantom import PhantomSpec, generate_phantom
from radserve.phantom.anatomy import Tissue, hu_table
from radserve.pipeline.ct_number import fat_peak_hu


def _volume(array: np.ndarray, pixel_mm: float = 0.78) -> Volume:
    return Volume.from_geometry(array, spacing=(5.0, pixel_mm, pixel_mm), origin=(0, 0, 0))


def _shifted(ct: Volume, offset: int) -> Volume:
    """As the evaluation grid shifts a CT: every voxel, clipped to the int16 CT range."""
    return ct.with_array(np.clip(ct.array.astype(np.int32) + offset, -1024, 3071).astype(np.int16))


@pytest.fixture(scope="module")
def full_size_phantom():
    """Seed 1 (its fat drawn at -109.7 HU) at full size and in-plane resolution, 40
    slices (the measurement reads at most 48)."""
    spec = PhantomSpec.random(1, small=False).with_slices(40)
    return spec, generate_phantom(spec)


@pytest.mark.parametrize("offset", [-40, -20, 0, 20, 40])
def test_the_fat_peak_is_where_the_phantom_drew_its_fat_plus_the_offset(full_size_phantom, offset):
    spec, phantom = full_size_phantom
    drawn = float(hu_table(spec.seed)[Tissue.FAT])
    measured = fat_peak_hu(_shifted(phantom.ct, offset))
    assert measured is not None
    assert abs(measured - (drawn + offset)) <= 2.0, (measured, drawn, offset)


def test_low_dose_noise_does_not_hide_the_peak(full_size_phantom):
    """4x the phantom's noise (60 HU SD per pixel): without the block means the peak
    flattens into soft tissue's flank (seed 0 at 2.5x found none)."""
    spec, _ = full_size_phantom
    noisy = generate_phantom(dataclasses.replace(spec, noise_sigma_hu=spec.noise_sigma_hu * 4))
    measured = fat_peak_hu(noisy.ct)
    assert measured is not None
    assert abs(measured - float(hu_table(spec.seed)[Tissue.FAT])) <= 3.0


@pytest.mark.parametrize("seed", [0, 8])
def test_small_phantoms_coarse_pixels_are_measured_as_they_are(seed):
    """2.5-3 mm pixels: no block mean (a block would be wider than the fat layer)."""
    _, ct = cell_phantom(seed, GridCell("hu_offset", -40), small=True)
    measured = fat_peak_hu(ct)
    assert measured is not None
    assert abs(measured - (float(hu_table(seed)[Tissue.FAT]) - 40)) <= 3.0


def test_an_independently_drawn_torso_reads_its_own_fat():
    """tests/factories/torso.py draws subcutaneous fat at -90 HU with 15 HU noise,
    with no code of radserve.phantom."""
    torso = simple_torso(slices=20)
    assert fat_peak_hu(torso) == pytest.approx(-90.0, abs=2.0)
    assert fat_peak_hu(_shifted(torso, -40)) == pytest.approx(-130.0, abs=2.0)


def test_a_thin_fat_layer_is_found_under_soft_tissues_larger_flank():
    """A fat layer 4-9 mm thick along one side is 3 % of the body, soft tissue (40 HU,
    30 HU noise) the rest: more voxels of soft tissue's flank than of fat fall inside the
    search window, but the flank has no peak there, so the window's maximum (at its top
    edge) would be wrong."""
    rng = np.random.default_rng(5)
    hu = np.full((20, 256, 256), -1000.0, np.float32)
    hu[:, 20:236, 20:236] = 40.0
    rows = np.arange(20, 236)
    depth = np.rint(8.5 + 3.0 * np.sin(rows / 9.0)).astype(int)  # 5.5-11.5 px of 0.78 mm
    for row, d in zip(rows, depth, strict=True):
        hu[:, row, 20 : 20 + d] = -105.0
    hu += rng.normal(0.0, 30.0, hu.shape).astype(np.float32)
    array = np.clip(np.rint(hu), -1024, 3071).astype(np.int16)
    window = (array >= -250) & (array <= -10)
    assert np.count_nonzero(window & (array > -40)) > np.count_nonzero(
        window & (np.abs(array + 105) <= 10)
    )
    assert fat_peak_hu(_volume(array)) == pytest.approx(-105.0, abs=4.0)
    assert fat_peak_hu(_volume(array.astype(np.float32))) == fat_peak_hu(_volume(array))


@pytest.mark.parametrize(
    "content",
    ["water cylinder", "air only", "bone and air"],
)
def test_a_study_without_fat_has_no_fat_peak(content):
    rng = np.random.default_rng(3)
    array = np.full((12, 128, 128), -1000, np.int16)
    if content == "water cylinder":
        y, x = np.mgrid[0:128, 0:128]
        array[:, (y - 64) ** 2 + (x - 64) ** 2 < 50**2] = 0
    elif content == "bone and air":
        array[:, 30:90, 30:90] = 700
    array = (array + rng.normal(0, 15, array.shape)).astype(np.int16)
    assert fat_peak_hu(_volume(array)) is None


def _facts(fat: float | None, modality: str = "CT", body_part: str = "CHEST"):
    return AcquisitionFacts(modality, 0.78, 5.0, 512, 512, 75, body_part, fat_hu=fat)


def test_a_declared_fat_range_flags_a_shifted_study_and_notes_an_unmeasured_one():
    domain = InputDomain.model_validate(
        {"fat_hu": {"min": -125, "max": -75}, "body_parts": ["CHEST"]}
    )
    assert domain_violations(domain, "CT", _facts(-100.0)) == []
    assert domain_violations(domain, "CT", _facts(-140.0)) == [
        "fat reads -140 HU, outside [-125, -75] HU: the CT numbers may be miscalibrated"
    ]
    assert domain_unchecked(domain, _facts(-140.0)) == []
    # no fat found: neither inside nor outside, said so; an MR is not a CT to check
    assert domain_violations(domain, "CT", _facts(None)) == []
    assert domain_unchecked(domain, _facts(None)) == [
        "CT-number calibration not checked: no fat peak between -250 and -10 HU "
        "(no body fat in view, or the CT numbers are far off)"
    ]
    assert domain_unchecked(domain, _facts(None, modality="MR")) == []
    assert domain_unchecked(domain, _facts(-100.0, body_part="")) == [
        "body part not checked: the series has no Body Part Examined"
    ]
    # a CT-number range may be negative; a size range may not
    with pytest.raises(ValueError, match=r"range min -75\.0 is above max -125\.0"):
        InputDomain.model_validate({"fat_hu": {"min": -75, "max": -125}})
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        InputDomain.model_validate({"fov_mm": {"min": -1}})
