"""clean_labels: minimum component size and keep-largest, on tiny label maps."""

from __future__ import annotations

import numpy as np
from tests.factories.findings import label, spec

from radserve.postprocess import clean_labels

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


def test_empty_map() -> None:
    a = np.zeros((3, 4, 5), np.uint8)
    assert not clean_labels(a, spec(LABELS, min_component_ml=1.0), 0.001).any()
