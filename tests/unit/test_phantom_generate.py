"""The in-memory phantom: geometry, anatomy, HU/label agreement, lesions, determinism."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.ndimage import binary_erosion

from radserve.phantom import ORGAN_LABELS, PhantomSpec, generate_phantom
from radserve.phantom.anatomy import Tissue
from radserve.phantom.generate import layout

SEEDS = (0, 2, 3)  # small phantoms with lesions in liver and lungs


@pytest.fixture(scope="module")
def phantoms():
    return {seed: generate_phantom(PhantomSpec.random(seed, small=True)) for seed in SEEDS}


def _centroid_mm(phantom, label: int) -> np.ndarray:
    idx = np.argwhere(phantom.organs.array == label).mean(axis=0)
    return phantom.ct.index_to_patient(idx)[0]


def test_volumes_share_geometry_and_dtypes(phantoms):
    p = phantoms[0]
    spec = p.spec
    assert p.ct.array.dtype == np.int16
    assert p.organs.array.dtype == np.uint8
    assert p.lesions.array.dtype == np.uint16
    assert p.ct.shape == spec.shape
    for vol in (p.organs, p.lesions, p.tissue, p.body):
        assert vol.same_geometry(p.ct)
        assert vol.frame_of_reference_uid == p.ct.frame_of_reference_uid
    assert p.ct.frame_of_reference_uid
    assert len(p.ct.source_sop_instance_uids) == spec.n_slices
    # axial stack, slices towards the head, rows posterior, columns patient left
    np.testing.assert_allclose(p.ct.direction, np.eye(3)[:, ::-1], atol=1e-12)
    np.testing.assert_allclose(p.ct.spacing, spec.spacing)
    np.testing.assert_allclose(
        p.ct.index_to_patient([[3, 0, 0]])[0][2], spec.origin[2] + 3 * spec.spacing[0]
    )


def test_every_organ_present_and_on_the_right_side(phantoms):
    for p in phantoms.values():
        for name, label in ORGAN_LABELS.items():
            assert (p.organs.array == label).sum() > 20, name
        body_x = p.spec.patient_offset_mm[0]
        c = {name: _centroid_mm(p, label) for name, label in ORGAN_LABELS.items()}
        assert c["liver"][0] < body_x < c["spleen"][0]  # liver patient right (-x)
        assert c["lung_right"][0] < body_x < c["lung_left"][0]
        assert c["kidney_right"][0] < body_x < c["kidney_left"][0]
        assert c["spleen"][1] > c["liver"][1]  # spleen posterior
        assert c["kidney_left"][1] > c["aorta"][1] - 10  # kidneys posterior
        assert c["spine"][1] > c["aorta"][1]  # aorta anterior of the spine
        assert c["lung_left"][2] > c["liver"][2]  # lungs above the liver (+z superior)
        assert c["heart"][2] > c["kidney_left"][2]


@pytest.mark.parametrize(
    ("tissue", "tol"),
    [(Tissue.LIVER, 4), (Tissue.SPLEEN, 8), (Tissue.AORTA, 8), (Tissue.FAT, 5), (Tissue.MUSCLE, 5)],
)
def test_hu_matches_tissue_inside_labels(phantoms, tissue, tol):
    p = phantoms[2]
    expected = layout(p.spec).hu[tissue]
    core = binary_erosion(p.tissue.array == tissue, iterations=1)
    assert core.sum() > 50
    assert abs(float(p.ct.array[core].mean()) - expected) < tol


def test_organ_map_agrees_with_hu(phantoms):
    p = phantoms[2]
    ct, organs = p.ct.array, p.organs.array
    liver = binary_erosion(organs == ORGAN_LABELS["liver"], iterations=1) & (p.lesions.array == 0)
    assert 85 < np.median(ct[liver]) < 115
    lung = binary_erosion(organs == ORGAN_LABELS["lung_left"], iterations=1)
    assert -880 < np.median(ct[lung]) < -800
    aorta = binary_erosion(organs == ORGAN_LABELS["aorta"], iterations=1)
    assert 200 < np.median(ct[aorta]) < 300
    outside = p.body.array == 0
    assert np.median(ct[outside & (p.tissue.array == Tissue.AIR)]) < -950
    assert 8 <= p.spec.noise_sigma_hu <= 25


def test_lesions_inside_their_organ_at_their_centre(phantoms):
    n_checked = 0
    for p in phantoms.values():
        ids = [lesion.lesion_id for lesion in p.lesion_list]
        assert ids == list(range(1, len(ids) + 1))
        assert set(np.unique(p.lesions.array)) <= {0, *ids}
        for lesion in p.lesion_list:
            mask = p.lesions.array == lesion.lesion_id
            assert mask.any()
            assert set(np.unique(p.organs.array[mask])) == {ORGAN_LABELS[lesion.organ]}
            centre = np.rint(p.ct.patient_to_index([lesion.centre_mm])[0]).astype(int)
            assert p.lesions.array[tuple(centre)] == lesion.lesion_id
            low, high = (3, 30) if lesion.organ.startswith("lung") else (5, 40)
            assert low <= lesion.diameter_mm <= high
            n_checked += 1
    assert n_checked >= 5


def test_lesion_hu_by_kind(phantoms):
    for p in phantoms.values():
        for lesion in p.lesion_list:
            core = binary_erosion(p.lesions.array == lesion.lesion_id)
            if lesion.kind == "liver_hyperdense":
                assert 160 <= lesion.hu <= 180
            elif lesion.kind == "lung_part_solid":
                assert lesion.ggo_hu is not None and -600 <= lesion.ggo_hu <= -450
            else:
                assert 20 <= lesion.hu <= 40
            if lesion.kind.startswith("liver") and core.sum() > 20:
                assert abs(float(p.ct.array[core].mean()) - lesion.hu) < 25


def test_lesion_count_distribution():
    counts = [PhantomSpec.random(seed).n_lesions for seed in range(200)]
    assert min(counts) == 0 and max(counts) <= 6
    assert 0.05 < counts.count(0) / len(counts) < 0.3


def test_same_seed_identical_other_seed_differs(phantoms):
    again = generate_phantom(PhantomSpec.random(0, small=True))
    first = phantoms[0]
    assert np.array_equal(again.ct.array, first.ct.array)
    assert np.array_equal(again.organs.array, first.organs.array)
    assert again.lesion_list == first.lesion_list
    assert PhantomSpec.random(0, small=True) != PhantomSpec.random(1, small=True)
    assert not np.array_equal(phantoms[2].organs.array[:20], phantoms[3].organs.array[:20])


def test_slice_subsets_equal_full_volume(phantoms):
    p = phantoms[3]
    for indices in (range(5, 17), range(0, 3), range(p.spec.n_slices - 4, p.spec.n_slices)):
        sub = generate_phantom(p.spec, indices)
        sel = list(indices)
        assert np.array_equal(sub.ct.array, p.ct.array[sel])
        assert np.array_equal(sub.organs.array, p.organs.array[sel])
        assert np.array_equal(sub.lesions.array, p.lesions.array[sel])
        np.testing.assert_allclose(sub.ct.affine[:3, 3], p.ct.index_to_patient([[sel[0], 0, 0]])[0])
        assert sub.ct.source_sop_instance_uids == ()
        assert sub.slice_indices == tuple(sel)
    strided = generate_phantom(p.spec, range(2, 30, 3))
    assert np.array_equal(strided.ct.array, p.ct.array[2:30:3])
    np.testing.assert_allclose(strided.ct.spacing[0], 3 * p.ct.spacing[0])
    np.testing.assert_allclose(
        strided.ct.index_to_patient([[4, 7, 9]]), p.ct.index_to_patient([[14, 7, 9]])
    )


def test_full_size_subset_is_fast_and_consistent():
    spec = PhantomSpec.random(11)
    assert spec.shape[1:] == (512, 512) and 100 <= spec.n_slices <= 500
    assert 0.6 <= spec.pixel_spacing_mm <= 0.9
    mid = spec.n_slices // 2
    wide = generate_phantom(spec, range(mid - 6, mid + 6))
    narrow = generate_phantom(spec, range(mid - 1, mid + 2))
    assert np.array_equal(narrow.ct.array, wide.ct.array[5:8])


def test_invalid_requests_raise():
    spec = PhantomSpec.random(1, small=True)
    with pytest.raises(ValueError, match="constant step"):
        generate_phantom(spec, [1, 2, 5])
    with pytest.raises(ValueError, match="must lie in"):
        generate_phantom(spec, [spec.n_slices])
    with pytest.raises(ValueError, match="seed must be >= 0"):
        PhantomSpec.random(-1)
    with pytest.raises(ValueError, match="pixel_spacing_mm"):
        dataclasses.replace(spec, pixel_spacing_mm=0.0)


def test_acquisition_override_keeps_the_patient():
    spec = PhantomSpec.random(2, small=True)
    thinner = spec.with_slices(n_slices=spec.n_slices * 2 - 1, slice_spacing_mm=2.5)
    a, b = generate_phantom(spec), generate_phantom(thinner)
    # same patient position: slice k of the original is slice 2k of the thinner one
    np.testing.assert_allclose(
        a.ct.index_to_patient([[4, 0, 0]]), b.ct.index_to_patient([[8, 0, 0]])
    )
    assert np.array_equal(a.organs.array[4], b.organs.array[8])


# The trainer's models depend on the anatomy: these values are frozen (API.md).
FROZEN_SEED_0 = {
    "organ_voxels": {
        "liver": 14772, "spleen": 1964, "kidney_left": 1013, "kidney_right": 1755,
        "lung_left": 15456, "lung_right": 20002, "heart": 6064, "aorta": 2419,
        "spine": 6936, "ribs": 5407,
    },
    "lesions": [
        ("lung_solid", "lung_right", 14.7, (-66.4699, -36.3703, 52.594)),
        ("liver_hypodense", "liver", 8.4, (-38.8786, -23.8288, -47.406)),
        ("lung_solid", "lung_left", 5.58, (58.9451, -43.8952, 77.594)),
        ("liver_hyperdense", "liver", 17.56, (-48.9118, -38.8786, -27.406)),
        ("lung_solid", "lung_left", 7.76, (68.9783, 8.7791, 42.594)),
    ],
}  # fmt: skip


def test_anatomy_and_lesions_are_frozen(phantoms):
    p = phantoms[0]
    for name, count in FROZEN_SEED_0["organ_voxels"].items():
        got = int((p.organs.array == ORGAN_LABELS[name]).sum())
        assert abs(got - count) <= max(3, 0.005 * count), name  # float32 maths may vary by CPU
    got = [(les.kind, les.organ, les.diameter_mm, les.centre_mm) for les in p.lesion_list]
    assert [g[:3] for g in got] == [f[:3] for f in FROZEN_SEED_0["lesions"]]
    for g, f in zip(got, FROZEN_SEED_0["lesions"], strict=True):
        np.testing.assert_allclose(g[3], f[3], atol=1e-3)


def test_lesion_diameter_cap_is_optional_and_only_shrinks_lesions():
    spec = dataclasses.replace(PhantomSpec.random(5), n_lesions=12)
    assert spec.lesion_max_diameter_mm is None  # default: the generator's own ranges
    capped = layout(dataclasses.replace(spec, lesion_max_diameter_mm=9.0)).lesions
    assert len(capped) >= 8
    assert all(p.lesion.diameter_mm <= 9.0 for p in capped)
    assert max(p.lesion.diameter_mm for p in layout(spec).lesions) > 9.0
    with pytest.raises(ValueError, match="lesion_max_diameter_mm"):
        dataclasses.replace(spec, lesion_max_diameter_mm=0.0)
