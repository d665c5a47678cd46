"""clean_labels: minimum component size and keep-largest, on tiny label maps."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage
from tests.factories.findings import label, spec

import radserve.postprocess.components as components_module
from radserve.postprocess import clean_labels
from radserve.preprocess.crop import label_bboxes

LABELS = [label(1, "liver"), label(2, "spleen")]


def _map() -> np.ndarray:
    a = np.zeros((10, 20, 20), np.uint8)
    a[1:6, 1:6, 1:6] = 1  # liver, 125 voxels
    a[8, 18, 18] = 1  # liver speck, 1 voxel
    a[7:9, 10:14, 1:4] = 1  # liver piece, 24 voxels
    a[1:4, 10:13, 10:13] = 2  # spleen, 27 voxels
    a[8, 1, 18] = 2  # spleen speck
    return a


def test_no_rules_returns_an_equal_copy() -> None:
    a = _map()
    out = clean_labels(a, spec(LABELS), 0.001)
    assert np.array_equal(out, a) and out is not a


def test_min_component_ml_removes_small_components_of_every_label() -> None:
    a = _map()
    out = clean_labels(a, spec(LABELS, min_component_ml=0.010), voxel_volume_ml=0.001)
    assert out[8, 18, 18] == 0 and out[8, 1, 18] == 0
    assert np.count_nonzero(out == 1) == 125 + 24
    assert np.count_nonzero(out == 2) == 27
    assert out.dtype == a.dtype


def test_keep_largest_only_touches_named_labels() -> None:
    a = _map()
    out = clean_labels(a, spec(LABELS, keep_largest=["liver"]), 0.001)
    assert np.count_nonzero(out == 1) == 125
    assert np.count_nonzero(out == 2) == 28  # spleen speck kept


def test_diagonal_neighbours_are_one_component() -> None:
    a = np.zeros((4, 4, 4), np.uint8)
    a[0, 0, 0] = a[1, 1, 1] = a[2, 2, 2] = 1  # touch at corners only (26-connectivity)
    a[3, 0, 3] = 1
    out = clean_labels(a, spec(LABELS, keep_largest=["liver"]), 1.0)
    assert np.count_nonzero(out) == 3 and out[3, 0, 3] == 0


def test_keep_largest_and_min_size_across_runs_of_slices() -> None:
    a = np.zeros((12, 10, 10), np.uint8)
    a[0:2, 0:3, 0:3] = 1  # 18 voxels, first run
    a[5:9, 2:6, 2:6] = 1  # 64 voxels, a later run: the largest
    a[11, 9, 9] = 1  # a speck in a third run
    a[11, 0, 0] = 2  # a speck of another label
    out = clean_labels(a, spec(LABELS, keep_largest=["liver"]), 0.001)
    assert np.count_nonzero(out == 1) == 64 and out[5:9, 2:6, 2:6].all()
    assert out[11, 0, 0] == 2
    out = clean_labels(a, spec(LABELS, min_component_ml=0.010), 0.001)
    assert np.count_nonzero(out == 1) == 18 + 64 and not out[11].any()


def test_empty_map() -> None:
    a = np.zeros((3, 4, 5), np.uint8)
    assert not clean_labels(a, spec(LABELS, min_component_ml=1.0), 0.001).any()


@pytest.mark.parametrize("seed", [0, 1])
def test_cleaned_boxes_are_the_boxes_of_the_cleaned_map(seed: int) -> None:
    """The boxes handed to the next model's ROI: what find_objects on the result says."""
    rng = np.random.default_rng(seed)
    labels = np.zeros((20, 30, 30), np.uint8)
    labels[4:12, 5:20, 6:18] = 1  # the organ
    labels[15:17, 25:28, 2:4] = 1  # a smaller piece of it, far away: dropped
    labels[2:5, 2:8, 20:29] = 2
    for z, y, x in rng.integers(0, 30, (15, 3)) % [20, 30, 30]:
        if labels[max(0, z - 1) : z + 2, max(0, y - 1) : y + 2, max(0, x - 1) : x + 2].any():
            continue  # touching something: not a speck
        labels[z, y, x] = rng.integers(1, 3)  # single voxels: dropped
    organ_spec = spec(LABELS, keep_largest=["liver"], min_component_ml=0.002)
    cleaned = components_module.clean_label_map(labels, organ_spec, 1e-3)
    # Told where the labels are, it searches only there, with the same result.
    within = (slice(1, 20), slice(0, 30), slice(1, 30))
    labels[0], labels[:, :, 0] = 0, 0
    assert components_module.clean_label_map(labels, organ_spec, 1e-3, within=within).boxes == (
        components_module.clean_label_map(labels, organ_spec, 1e-3).boxes
    )
    cleaned = components_module.clean_label_map(labels, organ_spec, 1e-3)
    assert cleaned.labels[15:17, 25:28, 2:4].max() == 0  # the far piece went
    assert np.count_nonzero(cleaned.labels) == 8 * 15 * 12 + 3 * 6 * 9
    assert cleaned.boxes == tuple(label_bboxes(cleaned.labels, 2))
    assert cleaned.boxes[0] == (slice(4, 12), slice(5, 20), slice(6, 18))


def _runs_to_ids(shape: tuple[int, ...], runs: list[components_module.ComponentRun]) -> np.ndarray:
    ids = np.zeros(shape, np.int64)
    for run in runs:
        part = run.components.astype(np.int64)
        ids[run.box] += np.where(part > 0, part + run.first - 1, 0)
    return ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_component_runs_give_the_ids_of_one_whole_array_pass(seed: int) -> None:
    import cc3d

    rng = np.random.default_rng(seed)
    labels = (rng.random((30, 24, 28)) > 0.93).astype(np.uint8) * rng.integers(1, 4, (30, 24, 28))
    labels = labels.astype(np.uint8)
    labels[10:13] = 0  # empty slices split the runs
    labels[20, 5:9, 5:9] = 2  # a run of one slice
    labels[21] = 0
    for values in ([1, 2, 3], [1, 3], [2]):
        selected = np.where(np.isin(labels, values), labels, 0)
        want, n = cc3d.connected_components(selected, connectivity=26, return_N=True)
        runs = components_module.component_runs(labels, values)
        assert len(runs) >= 3 and sum(run.n for run in runs) == n
        np.testing.assert_array_equal(_runs_to_ids(labels.shape, runs), want)
        counts = np.concatenate([[0]] + [run.counts[1:] for run in runs])
        np.testing.assert_array_equal(counts[1:], np.bincount(want.ravel(), minlength=n + 1)[1:])
        label = np.concatenate([[0]] + [run.label[1:] for run in runs])
        for cid in (1, n // 2, n):
            assert label[cid] == selected[want == cid][0]
        for run in runs:
            found = ndimage.find_objects(run.components, max_label=run.n)
            assert [run.component_box(i) for i in range(1, run.n + 1)] == found
    assert components_module.component_runs(np.zeros((3, 4, 5), np.uint8), [1]) == []


def test_component_runs_on_a_thin_box_with_separate_runs() -> None:
    """A 1x1x6 box holding two separate runs of one label: cc3d's bool path once failed
    here ("maximum length exception") and took the whole study down with it."""
    from radserve.postprocess.components import component_runs

    labels = np.array([[[3, 0, 3, 3, 0, 3]]], dtype=np.uint8)
    runs = component_runs(labels, [3])
    assert sum(int(run.counts[1:].size) for run in runs) == 3


@pytest.mark.parametrize("kept_ids", [0, 1, 6, 10])
def test_dropped_components_are_cleared_as_the_id_lookup_clears_them(kept_ids: int) -> None:
    """Few ids kept (keep_largest), few dropped (min_size), or many of both: the voxels
    cleared are those ``drop[components]`` marks, over more slices than one slab."""
    rng = np.random.default_rng(kept_ids)
    components = rng.integers(0, 13, (40, 9, 11)).astype(np.uint32)
    drop = np.ones(13, bool)
    drop[0] = False
    drop[rng.permutation(np.arange(1, 13))[:kept_ids]] = False
    region = rng.integers(1, 4, components.shape).astype(np.uint8)
    expected = region.copy()
    expected[drop[components]] = 0
    components_module._clear_dropped(region, components, drop)
    np.testing.assert_array_equal(region, expected)


def test_labels_spread_over_threads_give_the_serial_map_boxes_and_measurements() -> None:
    """Six organs whose boxes overlap, each with specks inside the others' boxes: the
    clean-up and the measurements on four threads equal those on one, voxel for voxel."""
    from radserve.domain import Volume
    from radserve.postprocess.findings import organ_measurements

    rng = np.random.default_rng(7)
    a = np.zeros((40, 64, 64), np.uint8)
    for v in range(1, 7):
        z, y, x = 3 * v, 6 * v, 5 * v
        a[z : z + 12, y : y + 14, x : x + 16] = v  # later organs overlap earlier boxes
        a[z + 13, y + 15, x : x + 2] = v  # a speck beside it
    specks = rng.integers(0, a.size, 300)
    a.reshape(-1)[specks] = rng.integers(1, 7, 300).astype(np.uint8)
    organ_spec = spec(
        [label(v, f"organ{v}") for v in range(1, 7)],
        min_component_ml=0.003,
        keep_largest=["organ1", "organ3", "organ5"],
    )
    one = components_module.clean_label_map(a.copy(), organ_spec, 1e-3, threads=1)
    four = components_module.clean_label_map(a.copy(), organ_spec, 1e-3, threads=4)
    assert np.array_equal(one.labels, four.labels) and one.boxes == four.boxes
    assert not np.array_equal(one.labels, a)  # specks were dropped
    ct = Volume(rng.integers(-1000, 1000, a.shape).astype(np.int16), np.eye(4))
    labels = ct.with_array(one.labels)
    assert organ_measurements(labels, ct, organ_spec, one.boxes, threads=4) == (
        organ_measurements(labels, ct, organ_spec, one.boxes, threads=1)
    )
