"""Declared processing ops (model.yaml ``preprocess`` / ``postprocess``): validation, the
older mapping read as ops, and each op on synthetic data against an independent
computation (scipy.ndimage) or a known answer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import ndimage
from tests.factories.findings import label, prediction, spec

from radserve.errors import ModelError
from radserve.models.manifest import ModelSpec, load_manifest
from radserve.models.ops import Gaussian, Median
from radserve.postprocess.components import clean_label_map, clean_labels
from radserve.postprocess.findings import box_iou, find_lesions
from radserve.postprocess.morphology import ball
from radserve.preprocess.crop import label_bboxes
from radserve.preprocess.denoise import apply_image_ops, read_filtered

NORM = {"kind": "ct_window", "center": 40, "width": 400}
ORGANS = [label(1, "liver"), label(2, "spleen")]
LESIONS = [label(1, "nodule", "lesion"), label(2, "mass", "lesion")]


def manifest(
    labels: list[dict[str, Any]],
    postprocess: Any = (),
    preprocess: Any = (),
    task: str = "segmentation",
) -> dict[str, Any]:
    return {
        "name": "m", "version": "1.0", "task": task, "modality": "CT",
        "input": {"mode": "2d", "spacing": (None, 1.0, 1.0), "normalisation": NORM},
        "labels": labels, "postprocess": list(postprocess), "preprocess": list(preprocess),
    }  # fmt: skip


def ops_spec(labels: list[dict[str, Any]], *postprocess: dict[str, Any], **kw: Any) -> ModelSpec:
    return ModelSpec.model_validate(manifest(labels, postprocess, **kw))


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        ModelSpec.model_validate(data)
    return str(info.value)


# --- validation -------------------------------------------------------------------------


def test_an_unknown_op_is_named_with_the_closest_known_one() -> None:
    message = refused(manifest(ORGANS, [{"op": "fill_hole"}]))
    assert "postprocess[0]: unknown operation 'fill_hole'" in message
    assert "did you mean 'fill_holes'?" in message
    message = refused(manifest(ORGANS, preprocess=[{"op": "medain", "size": 3}]))
    assert "unknown operation 'medain'" in message and "did you mean 'median'?" in message
    assert "has no 'op'" in refused(manifest(ORGANS, [{"ml": 1}]))
    assert "must be a mapping" in refused(manifest(ORGANS, ["min_size"]))


@pytest.mark.parametrize(
    ("op", "words"),
    [
        ({"op": "median", "size": 4}, "must be odd"),
        ({"op": "median", "size": 31}, "less than or equal to 9"),
        ({"op": "gaussian"}, "sigma_mm"),
    ],
)
def test_bad_preprocess_parameters_are_refused_clearly(op: dict, words: str) -> None:
    message = refused(manifest(ORGANS, preprocess=[op]))
    assert words in message and "preprocess" in message


@pytest.mark.parametrize(
    ("ops", "words"),
    [
        ([{"op": "min_size", "ml": -1}], "greater than or equal to 0"),
        ([{"op": "opening", "radius": 1}], "radius_mm"),  # misspelt parameter
        ([{"op": "nms", "iou": 1.5}], "less than or equal to 1"),
        ([{"op": "keep_largest", "labels": ["livr"]}], "unknown labels ['livr']"),
        ([{"op": "min_size", "ml": 1}, {"op": "threshold", "p": 0.4}], "must be the first"),
        ([{"op": "min_confidence", "value": 0.5}], "no finding labels"),
    ],
)
def test_bad_postprocess_ops_are_refused_clearly(ops: list, words: str) -> None:
    assert words in refused(manifest(ORGANS, ops))


def test_finding_ops_name_finding_labels_only() -> None:
    labels = [label(1, "liver"), label(2, "nodule", "lesion")]
    message = refused(manifest(labels, [{"op": "nms", "iou": 0.3, "labels": ["liver"]}]))
    assert "['liver'] are not of kind lesion/finding" in message


def test_the_older_postprocess_mapping_reads_as_the_equivalent_op_list() -> None:
    legacy = spec(ORGANS, threshold=0.4, min_component_ml=0.5, keep_largest=["liver"])
    written = ops_spec(
        ORGANS,
        {"op": "threshold", "p": 0.4},
        {"op": "min_size", "ml": 0.5},
        {"op": "keep_largest", "labels": ["liver"]},
    )
    assert legacy == written and legacy.threshold == 0.4
    assert spec(ORGANS).postprocess == ops_spec(ORGANS, {"op": "threshold", "p": 0.5}).postprocess
    assert "unknown keys 'min_component'" in refused(
        manifest(ORGANS) | {"postprocess": {"min_component": 1}}
    )


def test_a_bad_manifest_file_is_one_model_error_naming_file_and_op(tmp_path) -> None:
    import yaml

    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(manifest(ORGANS, [{"op": "closin", "radius_mm": 1}])))
    with pytest.raises(ModelError) as info:
        load_manifest(path)
    assert str(path) in str(info.value) and "did you mean 'closing'?" in str(info.value)


def test_with_finding_rules_replaces_or_adds_the_label_wide_rules() -> None:
    s = ops_spec(LESIONS, {"op": "min_size", "ml": 0.1}, {"op": "nms", "iou": 0.3})
    tuned = s.with_finding_rules(min_confidence=0.7, min_size_ml=0.2)
    assert [op.op for op in tuned.postprocess] == ["min_size", "nms", "min_confidence"]
    assert tuned.postprocess[0].ml == 0.2 and tuned.postprocess[2].value == 0.7
    loose = tuned.with_finding_rules(min_confidence=0.0, min_size_ml=0.0)
    assert [op.op for op in loose.postprocess] == ["nms"]


# --- preprocess ---------------------------------------------------------------------------


def _noisy_step(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    clean = np.zeros((3, 40, 40), np.int16)
    clean[:, :, 20:] = 100  # a vertical edge
    rng = np.random.default_rng(seed)
    noisy = clean.copy()
    salt = rng.random(clean.shape) < 0.05
    noisy[salt] = rng.choice(np.array([-500, 600], np.int16), int(salt.sum()))
    return clean, noisy


def test_median_removes_impulse_noise_and_keeps_the_edge() -> None:
    clean, noisy = _noisy_step()
    out = apply_image_ops(noisy, [Median(op="median", size=3)], (1.0, 1.0))
    assert out.dtype == noisy.dtype
    inner = (slice(None), slice(1, -1), slice(1, -1))
    assert np.mean(out[inner] != clean[inner]) < 0.01 < np.mean(noisy != clean)
    edge = (slice(None), slice(1, -1), slice(19, 21))  # not blurred: still a 0 | 100 step
    assert np.mean(out[edge] == clean[edge]) > 0.95
    blurred = apply_image_ops(noisy, [Gaussian(op="gaussian", sigma_mm=1.0)], (1.0, 1.0))
    assert np.mean(np.abs(blurred[edge] - clean[edge]) < 1) < 0.5
    # in-plane only: each slice is filtered on its own
    assert np.array_equal(out[1], ndimage.median_filter(noisy[1], size=3, mode="nearest"))


def test_gaussian_smooths_in_plane_by_sigma_in_mm() -> None:
    _, noisy = _noisy_step(1)
    op = Gaussian(op="gaussian", sigma_mm=1.0)
    out = apply_image_ops(noisy, [op], (0.5, 2.0))
    expected = ndimage.gaussian_filter(noisy[0].astype(np.float32), (2.0, 0.5), mode="nearest")
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("op", [Median(op="median", size=5), Gaussian(op="gaussian", sigma_mm=1)])
def test_a_crop_is_filtered_as_if_the_whole_slice_was(op: Median | Gaussian) -> None:
    _, noisy = _noisy_step(2)
    box = (slice(1, 3), slice(7, 25), slice(0, 13))
    whole = apply_image_ops(noisy, [op], (1.0, 1.0))
    np.testing.assert_array_equal(read_filtered(noisy, box, [op], (1.0, 1.0)), whole[box])
    assert read_filtered(noisy, box, [], (1.0, 1.0)).base is noisy  # no op: a plain view


# --- label-map ops ------------------------------------------------------------------------


def test_ball_is_an_ellipsoid_of_voxels_on_anisotropic_grids() -> None:
    b = ball(2.0, (2.5, 1.0, 1.0))
    assert b.shape == (1, 5, 5) and b.sum() == 13  # a disc: no neighbour slice within 2 mm
    assert ball(0.5, (1.0, 1.0, 1.0)).shape == (1, 1, 1)
    assert ball(1.0, (1.0, 1.0, 1.0)).sum() == 7


def _blob_with_spur() -> np.ndarray:
    a = np.zeros((12, 30, 30), np.uint8)
    a[2:10, 5:15, 5:15] = 1  # a block
    a[5, 15:25, 10] = 1  # a one-voxel spur
    a[2:10, 20:28, 20:28] = 2  # another label touching nothing
    return a


def test_opening_removes_thin_spurs_and_leaves_other_labels() -> None:
    a = _blob_with_spur()
    s = ops_spec(ORGANS, {"op": "opening", "radius_mm": 1.0, "labels": ["liver"]})
    cleaned = clean_label_map(a, s, 0.001, spacing=(1.0, 1.0, 1.0))
    expected = ndimage.binary_opening(np.pad(a == 1, 2), ball(1.0, (1, 1, 1)))[2:-2, 2:-2, 2:-2]
    np.testing.assert_array_equal(cleaned.labels == 1, expected)
    assert not cleaned.labels[5, 16:25, 10].any() and cleaned.labels[2:10, 6:14, 6:14].all()
    np.testing.assert_array_equal(cleaned.labels == 2, a == 2)
    z, y, x = np.nonzero(expected)
    assert cleaned.boxes[0] == tuple(slice(int(v.min()), int(v.max()) + 1) for v in (z, y, x))


def test_closing_bridges_gaps_but_never_takes_another_labels_voxels() -> None:
    a = np.zeros((6, 20, 30), np.uint8)
    a[1:5, 5:15, 2:10] = 1
    a[1:5, 5:15, 11:20] = 1  # one-voxel gap at column 10
    a[1:5, 14, 10] = 2  # a spleen voxel in the gap
    s = ops_spec(ORGANS, {"op": "closing", "radius_mm": 1.0})
    out = clean_labels(a, s, 0.001, spacing=(1.0, 1.0, 1.0))
    closed = ndimage.binary_closing(np.pad(a == 1, 3), ball(1.0, (1, 1, 1)))[3:-3, 3:-3, 3:-3]
    np.testing.assert_array_equal(out == 1, (a == 1) | (closed & (a == 0)))
    assert (out[2:4, 6:14, 10] == 1).all()  # gap closed inside
    assert (out[1:5, 14, 10] == 2).all()  # the spleen voxels stay spleen
    assert not out[0].any() and not out[:, :5].any()  # nothing grows outside the label


def test_fill_holes_fills_enclosed_background_in_3d_or_per_slice() -> None:
    a = np.zeros((7, 12, 12), np.uint8)
    a[1:6, 2:10, 2:10] = 1
    a[2:5, 4:8, 4:8] = 0  # closed cavity
    a[3, 5, 5] = 2  # another label inside it
    tube = np.zeros((7, 12, 12), np.uint8)
    tube[:, 2:10, 2:10] = 1
    tube[:, 4:8, 4:8] = 0  # open at both ends: a hole in each slice only
    filled = clean_labels(a, ops_spec(ORGANS, {"op": "fill_holes"}), 0.001)
    assert (filled[2:5, 4:8, 4:8] != 0).all() and filled[3, 5, 5] == 2
    assert np.count_nonzero(filled == 1) == np.count_nonzero(a == 1) + 47
    in_3d = clean_labels(tube, ops_spec(ORGANS, {"op": "fill_holes"}), 0.001)
    np.testing.assert_array_equal(in_3d, tube)
    in_plane = clean_labels(tube, ops_spec(ORGANS, {"op": "fill_holes", "in_plane": True}), 0.001)
    assert (in_plane[:, 2:10, 2:10] == 1).all()


def _reference_component_rules(a: np.ndarray, value: int, min_voxels: float, largest: bool):
    """min_size then keep_largest with scipy.ndimage.label (26-connectivity)."""
    comp, n = ndimage.label(a == value, structure=np.ones((3, 3, 3)))
    sizes = np.bincount(comp.ravel(), minlength=n + 1)
    keep = sizes >= min_voxels
    keep[0] = False
    if largest and keep.any():
        best = int(np.argmax(np.where(keep, sizes, -1)))
        keep[:] = False
        keep[best] = True
    return keep[comp]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("order", ["size_first", "largest_first"])
def test_min_size_and_keep_largest_match_scipy_on_random_blobs(seed: int, order: str) -> None:
    rng = np.random.default_rng(seed)
    a = np.zeros((16, 24, 24), np.uint8)
    a[ndimage.binary_opening(rng.random(a.shape) < 0.3)] = 1
    a[rng.random(a.shape) < 0.02] = 2
    ops = [{"op": "min_size", "ml": 0.004}, {"op": "keep_largest", "labels": ["liver"]}]
    s = ops_spec(ORGANS, *(ops if order == "size_first" else ops[::-1]))
    out = clean_labels(a, s, 0.001)
    np.testing.assert_array_equal(out == 1, _reference_component_rules(a, 1, 4, True))
    np.testing.assert_array_equal(out == 2, _reference_component_rules(a, 2, 4, False))


@pytest.mark.parametrize("seed", range(6))
def test_boxes_after_dropped_specks_are_the_tight_boxes_of_what_is_left(seed: int) -> None:
    """The clean-up shrinks a label's box past the faces its dropped specks held (it
    reads the faces, not cc3d's per-component boxes): specks are put on every face
    and corner of the organ's box, and the boxes must be a fresh search's."""
    rng = np.random.default_rng(seed)
    a = np.zeros((20, 30, 30), np.uint8)
    a[ndimage.binary_opening(rng.random(a.shape) < 0.35)] = 1
    a[:, :, 20:][a[:, :, 20:] == 1] = 2  # a second label beside the first
    for z, y, x in rng.integers(0, 2, (8, 3)) * [19, 29, 29]:
        a[max(0, z - 1) : z + 2, max(0, y - 1) : y + 2, max(0, x - 1) : x + 2] = 0
        a[z, y, x] = rng.integers(1, 3)  # an isolated voxel at a corner of the array
    a[10, 0, 5], a[10, 1, 4:7], a[9:12, 1, 5] = 1, 0, 0
    ops = [{"op": "min_size", "ml": 0.004}, {"op": "keep_largest", "labels": ["liver"]}]
    cleaned = clean_label_map(a, ops_spec(ORGANS, *ops), 0.001)
    np.testing.assert_array_equal(cleaned.labels == 1, _reference_component_rules(a, 1, 4, True))
    np.testing.assert_array_equal(cleaned.labels == 2, _reference_component_rules(a, 2, 4, False))
    assert cleaned.boxes == tuple(label_bboxes(cleaned.labels, len(cleaned.boxes)))


def test_box_after_far_specks_skips_the_planes_that_held_nothing() -> None:
    """Specks far from the organ leave empty planes between them in the label's box
    (up to 172 on the bench study): the box after the drop is still the tight one,
    found from the planes that held the label before it, on every face."""
    a = np.zeros((40, 50, 60), np.uint8)
    a[15:25, 20:30, 25:35] = 1  # the organ
    a[22, 24, 30] = 0  # a hole: the organ's planes need not be full
    for z, y, x in ((0, 0, 0), (39, 49, 59), (0, 49, 30), (39, 0, 59), (20, 0, 0)):
        a[z, y, x] = 1  # single-voxel specks on every face of the array
    a[15:25, 20:30, 40] = 2  # another label in the way of the organ's planes
    cleaned = clean_label_map(a, ops_spec(ORGANS, {"op": "keep_largest"}), 0.001)
    assert cleaned.boxes[0] == (slice(15, 25), slice(20, 30), slice(25, 35))
    assert cleaned.boxes == tuple(label_bboxes(cleaned.labels, len(cleaned.boxes)))


def test_ops_run_in_the_order_written() -> None:
    """min_size before an opening sees one component; after it, the pieces it leaves."""
    a = np.zeros((5, 20, 40), np.uint8)
    a[1:4, 5:15, 2:12] = 1  # 300 voxels
    a[1:4, 9:11, 12:16] = 1  # a thin bridge
    a[1:4, 8:12, 16:19] = 1  # a small lump (36 voxels) only the bridge joins to the block
    opening = {"op": "opening", "radius_mm": 1.5}
    min_size = {"op": "min_size", "ml": 0.05}
    before = clean_labels(a, ops_spec(ORGANS, min_size, opening), 0.001, spacing=(1, 1, 1))
    after = clean_labels(a, ops_spec(ORGANS, opening, min_size), 0.001, spacing=(1, 1, 1))
    assert before[2, 10, 17] == 1 and after[2, 10, 17] == 0
    assert after[2, 10, 6] == 1


def test_morphology_needs_the_spacing() -> None:
    with pytest.raises(ValueError, match="needs the voxel spacing"):
        clean_labels(_blob_with_spur(), ops_spec(ORGANS, {"op": "closing", "radius_mm": 1}), 1)


# --- finding ops ----------------------------------------------------------------------------


def _findings_case() -> tuple[np.ndarray, np.ndarray]:
    labels = np.zeros((10, 40, 40), np.uint8)
    conf = np.full(labels.shape, 255, np.uint8)
    labels[2:6, 5:15, 5:15] = 1  # nodule A, confidence 0.9
    conf[2:6, 5:15, 5:15] = 230
    labels[2:6, 5:15, 15:17] = 2  # mass B touching A: overlapping boxes? no (disjoint)
    conf[2:6, 5:15, 15:17] = 200
    ring = np.zeros((10, 40, 40), bool)
    ring[3:5, 20:36, 20:36] = True
    ring[3:5, 22:34, 22:34] = False  # a ring: nodule C, confidence 0.6
    labels[ring] = 1
    conf[ring] = 153
    labels[3:5, 26:30, 26:30] = 1  # nodule D inside the ring's box, confidence 0.95
    conf[3:5, 26:30, 26:30] = 242
    return labels, conf


def _finding_spec(*ops: dict[str, Any]) -> ModelSpec:
    return ops_spec(LESIONS, *ops, task="detection")


def _found(*ops: dict[str, Any]) -> list[tuple[str, float]]:
    labels, conf = _findings_case()
    result = find_lesions(prediction(labels, np.eye(4), conf), None, _finding_spec(*ops))
    return sorted((f.label, round(f.confidence, 2)) for f in result.findings)


def test_min_confidence_drops_findings_below_it_per_label() -> None:
    everything = _found()
    assert everything == [("mass", 0.78), ("nodule", 0.6), ("nodule", 0.9), ("nodule", 0.95)]
    assert _found({"op": "min_confidence", "value": 0.8}) == [("nodule", 0.9), ("nodule", 0.95)]
    only_masses = {"op": "min_confidence", "value": 0.8, "labels": ["mass"]}
    assert _found(only_masses) == [("nodule", 0.6), ("nodule", 0.9), ("nodule", 0.95)]


def test_nms_keeps_the_most_confident_of_overlapping_boxes() -> None:
    # D's box lies inside C's: IoU 16/256 ~ 0.06; C (less confident) goes at iou 0.05.
    assert _found({"op": "nms", "iou": 0.05}) == [("mass", 0.78), ("nodule", 0.9), ("nodule", 0.95)]
    assert _found({"op": "nms", "iou": 0.1}) == _found()  # below the overlap: nothing goes
    # A and B have adjacent, disjoint boxes: never suppressed, across labels or not
    assert ("mass", 0.78) in _found({"op": "nms", "iou": 0.01, "across_labels": False})


def test_finding_ops_apply_in_order() -> None:
    """nms before min_confidence lets a dropped finding suppress another first."""
    nms, conf = {"op": "nms", "iou": 0.05}, {"op": "min_confidence", "value": 0.96}
    assert _found(conf, nms) == []  # nothing left to suppress
    labels, confidence = _findings_case()
    confidence[3:5, 26:30, 26:30] = 250  # D now passes min_confidence 0.96
    spec_ = _finding_spec(nms, conf)
    result = find_lesions(prediction(labels, np.eye(4), confidence), None, spec_)
    assert [round(f.confidence, 2) for f in result.findings] == [0.98]
    assert result.label_map.array[3, 27, 27] == 1 and not result.label_map.array[3, 20, 20]


def test_box_iou() -> None:
    a = (slice(0, 4), slice(0, 4), slice(0, 4))
    assert box_iou(a, a) == 1.0
    assert box_iou(a, (slice(4, 8), slice(0, 4), slice(0, 4))) == 0.0
    assert box_iou(a, (slice(0, 4), slice(0, 4), slice(2, 6))) == pytest.approx(32 / 96)
