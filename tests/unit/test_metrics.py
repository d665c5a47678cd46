"""Evaluation metrics, lesion matching and summaries on hand-made masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from radserve.domain.volume import Volume
from radserve.evaluation.lesions import (
    SIZE_STRATA,
    GtLesion,
    component_centroids,
    match_lesions,
    size_stratum,
)
from radserve.evaluation.metrics import dice, hd95, surface
from radserve.evaluation.runner import (
    GroundTruth,
    StudyPrediction,
    evaluate,
    parse_seeds,
    score_study,
)
from radserve.evaluation.summary import StudyScores, summarise


def _box(shape, lo, hi):
    mask = np.zeros(shape, bool)
    mask[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))] = True
    return mask


# --- dice -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (_box((8, 8, 8), (1, 1, 1), (5, 5, 5)), _box((8, 8, 8), (1, 1, 1), (5, 5, 5)), 1.0),
        (_box((8, 8, 8), (0, 0, 0), (2, 2, 2)), _box((8, 8, 8), (4, 4, 4), (6, 6, 6)), 0.0),
        # 4x4x4 vs same shifted by 2 along x: overlap 4*4*2 = 32 -> 2*32/128
        (_box((8, 8, 8), (0, 0, 0), (4, 4, 4)), _box((8, 8, 8), (0, 0, 2), (4, 4, 6)), 0.5),
        (np.zeros((4, 4, 4), bool), _box((4, 4, 4), (0, 0, 0), (1, 1, 1)), 0.0),
    ],
)
def test_dice_known_values(a, b, expected):
    assert dice(a, b) == pytest.approx(expected)


def test_dice_both_empty_is_nan_and_shapes_must_match():
    assert math.isnan(dice(np.zeros((2, 2, 2)), np.zeros((2, 2, 2))))
    with pytest.raises(ValueError, match="one grid"):
        dice(np.zeros((2, 2, 2)), np.zeros((2, 2, 3)))


# --- hd95 -------------------------------------------------------------------------------
def test_hd95_identical_is_zero():
    a = _box((10, 10, 10), (2, 2, 2), (7, 7, 7))
    assert hd95(a, a, (1.0, 1.0, 1.0)) == 0.0


def test_hd95_parallel_slabs_is_their_distance_in_mm():
    a = _box((12, 6, 6), (2, 0, 0), (3, 6, 6))
    b = _box((12, 6, 6), (7, 0, 0), (8, 6, 6))
    # 5 slices apart at 2.5 mm per slice
    assert hd95(a, b, (2.5, 0.7, 0.7)) == pytest.approx(12.5)


def test_hd95_offset_cubes_match_brute_force_with_anisotropic_spacing():
    shape, spacing = (12, 14, 16), (3.0, 0.8, 1.1)
    a = _box(shape, (2, 2, 2), (7, 9, 10))
    b = _box(shape, (3, 4, 5), (9, 12, 13))
    pa = np.argwhere(surface(a)) * spacing
    pb = np.argwhere(surface(b)) * spacing
    d = cdist(pa, pb)
    expected = max(np.percentile(d.min(axis=1), 95), np.percentile(d.min(axis=0), 95))
    assert hd95(a, b, spacing) == pytest.approx(expected)


def test_hd95_empty_masks():
    empty = np.zeros((4, 4, 4), bool)
    one = _box((4, 4, 4), (1, 1, 1), (2, 2, 2))
    assert math.isnan(hd95(empty, empty, (1, 1, 1)))
    assert math.isinf(hd95(empty, one, (1, 1, 1)))
    assert math.isinf(hd95(one, empty, (1, 1, 1)))


# --- lesion matching --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("d", "stratum"), [(0.5, "<5"), (4.99, "<5"), (5.0, "5-10"), (10.0, "10-20"), (20.0, ">20")]
)
def test_size_strata_lower_bound_inclusive(d, stratum):
    assert size_stratum(d) == stratum


def _grid(shape=(10, 40, 40)):
    # identity direction so index (z, y, x) == mm (z, y, x) at 1 mm
    return Volume.from_geometry(np.zeros(shape, np.int16), spacing=(1, 1, 1), direction=np.eye(3))


def _hand_made_case():
    """Four GT lesions; prediction: overlap hit, centroid-only hit, a miss, two FPs, and
    one GT lesion claimed by two components (only one may match)."""
    grid = _grid()
    shape = grid.shape
    gt = np.zeros(shape, np.uint16)
    gt[_box(shape, (4, 5, 5), (7, 8, 8))] = 1  # 3 mm lesion
    gt[_box(shape, (2, 20, 5), (9, 27, 12))] = 2  # 7 mm lesion
    gt[_box(shape, (1, 5, 20), (9, 17, 32))] = 3  # 12 mm lesion
    lesions = [
        GtLesion(1, (5.0, 6.0, 6.0), 3.0, "lung_solid"),
        GtLesion(2, (5.0, 23.0, 8.0), 7.0, "liver_hypodense"),
        GtLesion(3, (4.5, 10.5, 25.5), 12.0, "liver_hypodense"),
        GtLesion(4, (5.0, 35.0, 35.0), 25.0, "liver_hyperdense"),  # nothing predicted
    ]
    pred = np.zeros(shape, np.uint16)
    pred[_box(shape, (5, 6, 6), (6, 7, 7))] = 7  # overlaps lesion 1
    pred[_box(shape, (5, 20, 14), (6, 21, 15))] = 8  # no overlap, centroid 6 mm away from 2
    pred[_box(shape, (2, 8, 22), (8, 14, 30))] = 9  # big overlap with 3
    pred[_box(shape, (8, 15, 30), (9, 16, 31))] = 10  # small overlap with 3 -> FP
    pred[_box(shape, (0, 35, 0), (1, 36, 1))] = 11  # far away -> FP
    return grid, gt, lesions, pred


def test_match_lesions_hand_made_case():
    grid, gt, lesions, pred = _hand_made_case()
    result = match_lesions(gt, lesions, pred, grid)
    matched = {o.lesion_id: o.matched_component for o in result.outcomes}
    # lesion 2's radius is 3.5 mm; component 8's centroid (5, 20, 14) is 6.7 mm away
    assert matched == {1: 7, 2: None, 3: 9, 4: None}
    assert result.n_predicted == 5
    assert set(result.false_positive_components) == {8, 10, 11}
    assert [o.stratum for o in result.outcomes] == ["<5", "5-10", "10-20", ">20"]


def test_match_by_centroid_within_radius():
    grid = _grid()
    gt = np.zeros(grid.shape, np.uint16)
    lesions = [GtLesion(1, (5.0, 20.0, 20.0), 10.0, "lung_part_solid")]  # sub-voxel in GT map
    pred = np.zeros(grid.shape, np.uint16)
    pred[5, 22, 23] = 4  # 3.6 mm from the centre, radius 5 mm
    result = match_lesions(gt, lesions, pred, grid)
    assert result.outcomes[0].matched_component == 4
    assert result.n_false_positive == 0


def test_summary_strata_recall_precision_fp_and_skipped_strata():
    grid, gt, lesions, pred = _hand_made_case()
    study = match_lesions(gt, lesions, pred, grid)
    scores = [
        StudyScores(seed=0, dice={"liver": 0.9}, hd95={"liver": 2.0}, lesions=study),
        StudyScores(seed=1, dice={"liver": 0.7}, hd95={"liver": math.inf}, lesions=study),
    ]
    s = summarise(scores)
    assert list(s.recall_by_size) == list(SIZE_STRATA)
    assert s.recall_by_size == {"<5": 1.0, "5-10": 0.0, "10-20": 1.0, ">20": 0.0}
    assert s.n_lesions_by_size == {"<5": 2, "5-10": 2, "10-20": 2, ">20": 2}
    assert s.recall_by_type["liver_hypodense"] == pytest.approx(0.5)
    assert s.recall_by_type["lung_part_solid"] is None
    assert s.precision == pytest.approx(2 / 5)
    assert s.fp_per_study == pytest.approx(3.0)
    assert s.dice == {"liver": pytest.approx(0.8)}
    assert s.dice_mean == pytest.approx(0.8)
    assert s.hd95 == {"liver": 2.0}
    assert any("hd95 liver" in n for n in s.notes)

    only_small = match_lesions(gt, lesions[:1], pred, grid)
    s2 = summarise([StudyScores(0, {}, {}, only_small)])
    assert s2.recall_by_size[">20"] is None
    assert any(">20 mm: no GT lesions" in n for n in s2.notes)
    assert s2.dice_mean is None


def test_parse_seeds():
    assert parse_seeds("0-3,7, 5-5") == [0, 1, 2, 3, 5, 7]
    with pytest.raises(ValueError, match="bad seed range"):
        parse_seeds("3-x")
    # a huge range built its whole list first (gigabytes for 0-99999999999)
    assert len(parse_seeds("0-9999")) == 10_000
    for text in ("0-99999999999", "0-9999,20000"):
        with pytest.raises(ValueError, match="more than 10000 seeds"):
            parse_seeds(text)


def test_evaluate_scores_each_precision_on_the_same_truth():
    grid, gt, lesions, pred = _hand_made_case()
    organs = np.zeros(grid.shape, np.uint8)
    organs[_box(grid.shape, (0, 0, 0), (10, 20, 20))] = 1

    def truth(seed: int) -> GroundTruth:
        return GroundTruth(seed, grid, organs, {"liver": 1, "spleen": 2}, gt, tuple(lesions))

    def predict(ct, precision):
        labels = np.where(organs == 1, 5, 0).astype(np.uint8)  # model's liver value is 5
        if precision == "int8":
            labels[:, :10] = 0  # lose half the liver
        return labels, pred, []

    out = evaluate(
        predict, seeds=[0, 1], organ_labels={"liver": 5}, precisions=["fp32", "int8"], truth=truth
    )
    assert out["fp32"].dice == {"liver": 1.0}
    assert out["int8"].dice["liver"] == pytest.approx(2 / 3)
    assert out["fp32"].seeds == [0, 1] and out["int8"].variant == "int8"
    with pytest.raises(ValueError, match="training seeds"):
        evaluate(predict, seeds=[1000], organ_labels={"liver": 5}, truth=truth)
    with pytest.raises(ValueError, match="shape"):
        score_study(
            truth(0),
            StudyPrediction(np.zeros((1, 1, 1), np.uint8), pred),
            organ_labels={"liver": 5},
        )


def test_component_centroids_are_scipys_centre_of_mass_exactly():
    """The centroids summed over the non-zero voxels are the floats scipy's
    center_of_mass gives over the whole map (ids with gaps, one-voxel components)."""
    from scipy import ndimage

    rng = np.random.default_rng(3)
    labels = rng.choice([0, 0, 0, 0, 2, 7, 40], size=(9, 23, 17)).astype(np.int32)
    labels[4, 5, 6] = 1000  # a one-voxel component
    ids, centroids = component_centroids(labels)
    assert ids == sorted(int(v) for v in np.unique(labels) if v != 0)
    expected = np.asarray(ndimage.center_of_mass(labels > 0, labels, ids), dtype=float)
    assert np.array_equal(centroids, expected)
    assert component_centroids(np.zeros((3, 4, 5), dtype=np.int32))[0] == []
