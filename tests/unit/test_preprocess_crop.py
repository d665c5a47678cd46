"""Boxes of label values without full-size masks, and sub-grids that know where they lie."""

from __future__ import annotations

import numpy as np
import pytest

from radserve.domain.volume import Volume
from radserve.preprocess import (
    bbox_of_mask,
    bbox_of_values,
    crop_volume,
    grid_offset,
    label_bboxes,
    roi_bbox,
)


def _labels(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = np.zeros((9, 20, 31), np.uint8)
    for value in (1, 2, 4):
        z, y, x = rng.integers(0, 6, 3)
        labels[z : z + 3, y : y + 9, x : x + 12] = value
    return labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_boxes_equal_the_mask_boxes(seed: int) -> None:
    labels = _labels(seed)
    boxes = label_bboxes(labels, 5)
    assert boxes[2] is None and boxes[4] is None  # values 3 and 5 are absent
    for value in (1, 2, 4):
        assert boxes[value - 1] == bbox_of_mask(labels == value)
    for values in ([1], [2, 4], [1, 2, 4], [1, 3]):
        assert bbox_of_values(labels, values) == bbox_of_mask(np.isin(labels, values))
    assert bbox_of_values(labels, [3, 5]) is None
    assert bbox_of_values(labels.astype(np.uint16), [2]) == boxes[1]


def test_roi_bbox_grows_by_the_margin_in_mm() -> None:
    labels = np.zeros((10, 20, 20), np.uint8)
    labels[4:6, 8:10, 8:10] = 3
    vol = Volume.from_geometry(labels, spacing=(2.0, 1.0, 0.5))
    assert roi_bbox(vol, [3], 2.0) == (slice(3, 7), slice(6, 12), slice(4, 14))
    assert roi_bbox(vol, [1], 2.0) is None


def test_crop_volume_is_a_box_of_the_grid() -> None:
    vol = Volume.from_geometry(
        np.arange(4 * 5 * 6, dtype=np.int16).reshape(4, 5, 6),
        spacing=(2.0, 0.7, 0.9),
        origin=(10.0, -5.0, 3.0),
        source_sop_instance_uids=("a", "b", "c", "d"),
    )
    box = (slice(1, 3), slice(2, 5), slice(0, 4))
    sub = crop_volume(vol, box)
    assert sub.shape == (2, 3, 4) and sub.source_sop_instance_uids == ("b", "c")
    np.testing.assert_array_equal(sub.array, vol.array[box])
    np.testing.assert_allclose(sub.index_to_patient([1, 1, 1]), vol.index_to_patient([2, 3, 1]))
    assert grid_offset(sub, vol) == (1, 2, 0)
    assert grid_offset(vol, vol) == (0, 0, 0)


def test_grid_offset_refuses_what_is_not_a_box_of_the_grid() -> None:
    vol = Volume.from_geometry(np.zeros((4, 5, 6)), spacing=(2.0, 0.7, 0.9))
    half = Volume(np.zeros((2, 2, 2)), vol.affine.copy())
    half.affine[:3, 3] += 0.5 * vol.affine[:3, 1]  # half a row off
    assert grid_offset(half, vol) is None
    coarse = Volume.from_geometry(np.zeros((2, 2, 2)), spacing=(4.0, 1.4, 1.8))
    assert grid_offset(coarse, vol) is None
    beyond = crop_volume(
        Volume.from_geometry(np.zeros((8, 5, 6)), spacing=vol.spacing),
        (
            slice(3, 8),
            slice(0, 5),
            slice(0, 6),
        ),
    )
    assert grid_offset(beyond, vol) is None  # reaches past the last slice
