"""Lesion findings and organ measurements from synthetic predictions with known geometry."""

from __future__ import annotations

import numpy as np
import pytest
from tests.factories.findings import ellipsoid, label, oblique_affine, prediction, spec

from radserve.domain import Finding, Prediction, Volume
from radserve.postprocess import extract_findings, find_lesions, organ_measurements
from radserve.postprocess.components import clean_label_map
from radserve.preprocess import crop_volume

SHAPE = (24, 64, 64)
SPACING = (2.0, 0.8, 0.6)
ORGANS = spec([label(1, "liver"), label(2, "lung"), label(3, "spleen")], name="organs")
ORGAN_NAMES = {1: "liver", 2: "lung", 3: "spleen"}


def _lesion_spec(**postprocess) -> object:
    return spec(
        [
            label(1, "liver lesion", "lesion", within=("liver",)),
            label(2, "nodule", "lesion", within=("lung",)),
        ],
        name="lesions",
        **postprocess,
    )


def _organ_map() -> np.ndarray:
    organs = np.zeros(SHAPE, np.uint8)
    organs[:, :, :32] = 1  # liver: left half of the columns
    organs[:, :, 32:] = 2  # lung: right half
    return organs


def _affines() -> dict[str, np.ndarray]:
    flipped = Volume.from_geometry(
        np.zeros(SHAPE), spacing=SPACING, origin=(10.0, -20.0, 30.0)
    ).affine
    flipped[:3, 2] *= -1  # columns towards patient right
    flipped[:3, 0] *= -1  # slices towards feet
    return {
        "axial": Volume.from_geometry(np.zeros(SHAPE), spacing=SPACING).affine,
        "flipped": flipped,
        "oblique": oblique_affine(SPACING, 25.0),
    }


@pytest.mark.parametrize("name", ["axial", "flipped", "oblique"])
def test_sphere_lesion_volume_diameter_centroid(name: str) -> None:
    affine = _affines()[name]
    r, centre = 8.0, (12.0, 30.0, 16.0)
    mask = ellipsoid(SHAPE, SPACING, centre, (r, r, r))
    pred = prediction(mask * 1, affine, mask * 200)
    ct = pred.labels.with_array(np.where(mask, 60.0, -100.0).astype(np.float32))
    organs = pred.labels.with_array(_organ_map())
    [f] = extract_findings(pred, ct, _lesion_spec(), organs, ORGAN_NAMES)
    assert f.finding_id == 1 and f.label_value == 1 and f.label == "liver lesion"
    assert f.volume_ml == pytest.approx(4 / 3 * np.pi * r**3 / 1000, rel=0.05)
    assert f.longest_diameter_mm == pytest.approx(2 * r, abs=1.0)
    assert f.short_axis_mm == pytest.approx(2 * r, abs=1.2)
    assert f.key_slice_index == 12
    assert f.centroid_voxel == pytest.approx(centre, abs=0.05)
    expected = pred.labels.index_to_patient(np.array(centre))[0]
    assert f.centroid_mm == pytest.approx(tuple(expected), abs=0.1)
    assert f.containing_organ == "liver"
    assert f.mean_hu == pytest.approx(60.0)
    assert f.confidence == pytest.approx(200 / 255)
    assert (f.model, f.model_version, f.precision) == ("lesions", "1.0", "fp32")


def _two_lesions() -> tuple[np.ndarray, np.ndarray]:
    labels = np.zeros(SHAPE, np.uint8)
    conf = np.zeros(SHAPE, np.uint8)
    liver = ellipsoid(SHAPE, SPACING, (8, 20, 12), (6, 6, 6))
    lung = ellipsoid(SHAPE, SPACING, (16, 40, 50), (4, 4, 4))
    big = ellipsoid(SHAPE, SPACING, (16, 44, 14), (9, 9, 9))
    labels[liver], conf[liver] = 1, 230
    labels[big], conf[big] = 1, 90
    labels[lung], conf[lung] = 2, 250
    return labels, conf


def test_ids_follow_organ_then_volume_and_label_map_uses_ids() -> None:
    labels, conf = _two_lesions()
    affine = _affines()["axial"]
    pred = prediction(labels, affine, conf)
    organs = pred.labels.with_array(_organ_map())
    result = find_lesions(pred, None, _lesion_spec(), organs, ORGAN_NAMES)
    got = [(f.finding_id, f.containing_organ, f.label) for f in result.findings]
    assert got == [
        (1, "liver", "liver lesion"),
        (2, "liver", "liver lesion"),
        (3, "lung", "nodule"),
    ]
    assert result.findings[0].volume_ml > result.findings[1].volume_ml
    assert result.label_map.array.dtype == np.uint8
    assert result.label_map.same_geometry(pred.labels)
    for f in result.findings:
        vox = tuple(round(c) for c in f.centroid_voxel)
        assert result.label_map.array[vox] == f.finding_id
        assert f.mean_hu is None  # no CT given
    assert [a.finding_id for a in result.axes] == [1, 2, 3]
    assert np.count_nonzero(result.label_map.array) == np.count_nonzero(labels)
    # The boxes the clean-up hands over give the same findings as finding them here.
    cleaned = clean_label_map(labels, _lesion_spec(), 1.0)  # 1 ml voxels: nothing dropped
    np.testing.assert_array_equal(cleaned.labels, labels)
    boxes = cleaned.boxes
    handed = find_lesions(pred, None, _lesion_spec(), organs, ORGAN_NAMES, boxes=boxes)
    assert handed.findings == result.findings
    np.testing.assert_array_equal(handed.label_map.array, result.label_map.array)


@pytest.mark.parametrize("name", ["axial", "flipped", "oblique"])
def test_roi_sized_prediction_gives_the_same_findings_on_the_full_grid(name: str) -> None:
    labels, conf = _two_lesions()
    full = prediction(labels, _affines()[name], conf)
    ct = full.labels.with_array(np.where(labels > 0, 70.0, -50.0).astype(np.float32))
    organs = full.labels.with_array(_organ_map())
    box = (slice(2, 23), slice(10, 60), slice(0, 61))  # holds every lesion voxel
    assert np.count_nonzero(labels[box]) == np.count_nonzero(labels)
    sub = Prediction(
        model=full.model,
        model_version=full.model_version,
        precision=full.precision,
        labels=crop_volume(full.labels, box),
        confidence=crop_volume(full.confidence, box),
    )
    assert sub.labels.shape == (21, 50, 61)
    want = find_lesions(full, ct, _lesion_spec(), organs, ORGAN_NAMES)
    got = find_lesions(sub, ct, _lesion_spec(), organs, ORGAN_NAMES)
    assert got.findings == want.findings and got.axes == want.axes
    assert got.label_map.same_geometry(ct)
    np.testing.assert_array_equal(got.label_map.array, want.label_map.array)
    # Without the CT there is no full grid to go back to: the prediction's grid is used.
    alone = find_lesions(sub, None, _lesion_spec(), organs, ORGAN_NAMES)
    assert alone.label_map.same_geometry(sub.labels)
    np.testing.assert_array_equal(alone.label_map.array, want.label_map.array[box])


def test_min_confidence_and_min_size_filter() -> None:
    labels, conf = _two_lesions()
    pred = prediction(labels, _affines()["axial"], conf)
    findings = extract_findings(pred, None, _lesion_spec(min_confidence=0.5))
    assert len(findings) == 2 and all(f.confidence > 0.5 for f in findings)
    findings = extract_findings(pred, None, _lesion_spec(min_component_ml=1.0))
    assert [round(f.volume_ml) for f in findings] == [3]  # only the big one (~3 ml)


def test_within_drops_lesions_outside_their_organs() -> None:
    labels, conf = _two_lesions()
    pred = prediction(labels, _affines()["axial"], conf)
    organs = np.full(SHAPE, 1, np.uint8)  # everything is liver: the nodule is not in lung
    result = find_lesions(pred, None, _lesion_spec(), pred.labels.with_array(organs), ORGAN_NAMES)
    assert [f.label for f in result.findings] == ["liver lesion", "liver lesion"]
    assert not result.warnings
    assert not np.isin(result.label_map.array, [3]).any()
    # without an organ map the rule cannot be checked: kept, with a warning
    result = find_lesions(pred, None, _lesion_spec())
    assert len(result.findings) == 3
    assert any("within" in w for w in result.warnings)


def test_lesion_in_a_hole_of_the_organ_mask_takes_the_surrounding_organ() -> None:
    mask = ellipsoid(SHAPE, SPACING, (12, 32, 48), (5, 5, 5))
    organs = _organ_map()
    organs[mask] = 0  # juxtapleural nodule left out of the lung mask
    pred = prediction(mask * 2, _affines()["axial"], mask * 255)
    [f] = extract_findings(pred, None, _lesion_spec(), pred.labels.with_array(organs), ORGAN_NAMES)
    assert f.containing_organ == "lung"


def test_organ_map_on_another_grid_is_sampled_through_patient_space() -> None:
    mask = ellipsoid(SHAPE, SPACING, (12, 32, 48), (5, 5, 5))
    pred = prediction(mask * 2, _affines()["axial"], mask * 255)
    coarse = Volume.from_geometry(
        _organ_map()[::2, ::2, ::2].copy(), spacing=tuple(2 * s for s in SPACING)
    )
    coarse = Volume(coarse.array, coarse.affine.copy())
    coarse.affine[:3, 3] += np.asarray(SPACING) * 0.5 * np.array([0, 1, 1])  # voxel centres
    [f] = extract_findings(pred, None, _lesion_spec(), coarse, ORGAN_NAMES)
    assert f.containing_organ == "lung"


def test_no_confidence_map_gives_confidence_one_and_a_warning() -> None:
    mask = ellipsoid(SHAPE, SPACING, (12, 32, 16), (4, 4, 4))
    pred = prediction(mask * 1, _affines()["axial"])
    result = find_lesions(pred, None, _lesion_spec(min_confidence=0.9))
    assert result.findings[0].confidence == 1.0
    assert any("confidence" in w for w in result.warnings)


def test_no_lesions_gives_an_empty_map() -> None:
    pred = prediction(np.zeros(SHAPE, np.uint8), _affines()["axial"])
    result = find_lesions(pred, None, _lesion_spec())
    assert result.findings == [] and not result.label_map.array.any()


def test_organ_measurements_volume_and_mean_hu() -> None:
    organs = _organ_map()
    organs[:, :10, :] = 0
    volume = Volume(organs, _affines()["oblique"])
    ct = volume.with_array(np.where(organs == 1, 55.0, -800.0).astype(np.float32))
    out = organ_measurements(volume, ct, ORGANS)
    assert [m.label for m in out] == ["liver", "lung", "spleen"]
    voxel_ml = np.prod(SPACING) / 1000
    assert out[0].volume_ml == pytest.approx(24 * 54 * 32 * voxel_ml)
    assert out[0].mean_hu == pytest.approx(55.0)
    assert out[1].mean_hu == pytest.approx(-800.0)
    # Issue 11 (6): an absent organ is not found (no volume), not a measured 0 ml; these
    # organs fill whole slices, so they reach the first and last slice, row and column.
    assert (out[2].coverage, out[2].volume_ml, out[2].mean_hu) == ("not_found", None, None)
    assert out[0].coverage == "partial"
    assert out[0].edges == ("first_slice", "last_slice", "last_row", "first_column")
    assert out[1].edges == ("first_slice", "last_slice", "last_row", "last_column")
    assert out[0].model == "organs" and out[0].concept.meaning == "liver"
    # The boxes clean-up hands over give the same numbers as finding them here.
    cleaned = clean_label_map(organs, ORGANS, voxel_ml)
    assert organ_measurements(volume, ct, ORGANS, cleaned.boxes) == out


@pytest.mark.parametrize(
    ("box", "edges"),
    [
        ((slice(3, 9), slice(10, 20), slice(5, 40)), ()),
        ((slice(0, 9), slice(10, 20), slice(5, 40)), ("first_slice",)),
        ((slice(3, 24), slice(10, 20), slice(5, 40)), ("last_slice",)),
        ((slice(3, 9), slice(0, 64), slice(5, 40)), ("first_row", "last_row")),
        ((slice(3, 9), slice(10, 20), slice(63, 64)), ("last_column",)),
        ((slice(0, 24), slice(0, 64), slice(0, 64)), (
            "first_slice", "last_slice", "first_row", "last_row", "first_column", "last_column"
        )),
    ],
)  # fmt: skip
def test_organ_coverage_follows_the_edges_it_reaches(box, edges) -> None:
    """An organ that reaches an edge of the volume runs on outside it: partial, its
    volume a lower bound; one wholly inside is complete."""
    organs = np.zeros(SHAPE, np.uint8)
    organs[box] = 3  # spleen
    [_, _, spleen] = organ_measurements(Volume(organs, _affines()["flipped"]), None, ORGANS)
    assert spleen.edges == edges
    assert spleen.coverage == ("partial" if edges else "complete")
    voxel_ml = np.prod(SPACING) / 1000
    assert spleen.volume_ml == pytest.approx(np.count_nonzero(organs) * voxel_ml)


def test_mr_has_no_hounsfield_units() -> None:
    mr_spec = spec([label(1, "liver")], modality="MR")
    volume = Volume(_organ_map(), _affines()["axial"])
    [liver] = organ_measurements(volume, volume.with_array(np.ones(SHAPE)), mr_spec)
    assert liver.mean_hu is None and liver.volume_ml > 0


def test_findings_touching_an_edge_of_the_volume_are_partial_with_their_edges() -> None:
    """A lesion cut by the first or last slice or the in-plane border goes on outside
    the scan: partial with that edge (its diameters and volume are lower bounds); one
    wholly inside is complete. The edge is the full grid's, not an ROI box's."""
    labels = np.zeros(SHAPE, np.uint8)
    labels[0:3, 10:16, 10:16] = 1  # first slice
    labels[21:24, 40:46, 10:16] = 1  # last slice
    labels[8:12, 20:26, 58:64] = 1  # last column (in-plane border)
    labels[10:14, 40:46, 20:26] = 1  # wholly inside
    pred = prediction(labels, _affines()["axial"], labels * 200)
    got = {
        f.centroid_voxel: (f.coverage, f.edges)
        for f in extract_findings(pred, None, _lesion_spec())
    }
    assert got == {
        (1.0, 12.5, 12.5): ("partial", ("first_slice",)),
        (22.0, 42.5, 12.5): ("partial", ("last_slice",)),
        (9.5, 22.5, 60.5): ("partial", ("last_column",)),
        (11.5, 42.5, 22.5): ("complete", ()),
    }
    # On a box of the CT's grid, touching the box's border is not touching the volume's.
    ct = pred.labels.with_array(np.zeros(SHAPE, np.float32))
    box = (slice(0, 24), slice(10, 46), slice(10, 64))
    sub = Prediction("lesions", "1.0", "fp32", crop_volume(pred.labels, box))
    assert [(f.coverage, f.edges) for f in extract_findings(sub, ct, _lesion_spec())] == [
        (f.coverage, f.edges) for f in extract_findings(pred, ct, _lesion_spec())
    ]
    inside = extract_findings(pred, None, _lesion_spec())[-1]
    with pytest.raises(ValueError, match="partial exactly when"):
        Finding.model_validate({**inside.model_dump(), "coverage": "partial", "edges": []})
