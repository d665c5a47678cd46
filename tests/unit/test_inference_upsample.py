"""Sparse upsampled decision == interpolating every class everywhere, then deciding."""

from __future__ import annotations

import numpy as np
import pytest
from tests.factories.onnx_models import model_spec

from radserve.inference.tasks import activate, decide
from radserve.inference.upsample import UpsampledDecision
from radserve.models.manifest import ModelSpec
from radserve.preprocess.resample import grid_coordinates, interpolate_axis


def plain(probs: np.ndarray, h: int, w: int, spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """What the slice engine did before: every class onto every native pixel."""
    _, rh, rw = probs.shape
    out = probs
    if rh != h:
        out = interpolate_axis(out, 1, grid_coordinates(rh, h), order=1)
    if rw != w:
        out = interpolate_axis(out, 2, grid_coordinates(rw, w), order=1)
    return decide(out, spec, axis=0)


def blobby_logits(k: int, rh: int, rw: int, seed: int) -> np.ndarray:
    """Smooth class regions (like an organ map) with sharp, noisy boundaries."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:rh, 0:rw].astype(np.float32)
    logits = np.empty((k, rh, rw), np.float32)
    for c in range(k):
        cy, cx, r = rng.uniform(0, rh), rng.uniform(0, rw), rng.uniform(3, rh / 2)
        logits[c] = 8.0 * (1 - np.hypot(y - cy, x - cx) / r) + rng.normal(0, 0.5, (rh, rw))
    return logits


@pytest.mark.parametrize(
    ("k", "low", "native", "activation"),
    [
        (10, (40, 52), (83, 101), "softmax"),  # organs: 1.5 mm -> ~0.75 mm
        (3, (40, 52), (57, 74), "softmax"),  # lesions: 1.0 mm -> 0.7 mm
        (3, (40, 52), (40, 110), "softmax"),  # rows not resampled
        (2, (40, 52), (31, 40), "softmax"),  # downsampling back (coarse native grid)
        (3, (40, 52), (83, 101), "sigmoid"),
    ],
)
def test_sparse_decision_matches_the_plain_one(
    k: int, low: tuple[int, int], native: tuple[int, int], activation: str
) -> None:
    labels_k = k - 1 if activation == "softmax" else k
    spec = model_spec(labels=labels_k, activation=activation, kind="lesion")
    for seed in range(3):
        probs = activate(blobby_logits(k, *low, seed), activation, axis=0)
        upsample = UpsampledDecision(
            grid_coordinates(low[0], native[0]), low[0], grid_coordinates(low[1], native[1]), low[1]
        )
        labels, conf = upsample(probs, spec)
        want_labels, want_conf = plain(probs, *native, spec)
        assert labels.shape == native and labels.dtype == np.uint8
        np.testing.assert_array_equal(labels, want_labels)
        np.testing.assert_array_equal(conf, want_conf)
        # Most pixels took the shortcut, and some did not: both paths were exercised.
        assert 0.0 < upsample.boundary_fraction < 0.6
        assert set(np.unique(labels)) == set(np.unique(want_labels))


def test_ties_go_to_the_first_class_as_in_decide() -> None:
    spec = model_spec(labels=2)
    probs = np.full((3, 4, 4), 1 / 3, np.float32)  # every class equal everywhere
    upsample = UpsampledDecision(grid_coordinates(4, 9), 4, grid_coordinates(4, 7), 4)
    labels, conf = upsample(probs, spec)
    want_labels, want_conf = plain(probs, 9, 7, spec)
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(conf, want_conf)
    assert not labels.any()


def test_single_pixel_islands_are_interpolated_not_lost() -> None:
    """A one-pixel lesion on the model grid still reaches the native grid."""
    spec = model_spec(labels=1, kind="lesion")
    logits = np.zeros((2, 20, 20), np.float32)
    logits[1, 9, 11] = 6.0  # one confident pixel
    probs = activate(logits, "softmax", axis=0)
    upsample = UpsampledDecision(grid_coordinates(20, 43), 20, grid_coordinates(20, 43), 20)
    labels, conf = upsample(probs, spec)
    want_labels, want_conf = plain(probs, 43, 43, spec)
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(conf, want_conf)
    assert labels.sum() > 0


@pytest.mark.parametrize(
    ("low", "native"), [((1, 9), (3, 20)), ((7, 1), (15, 2)), ((1, 1), (4, 3))]
)
def test_single_row_or_column_grids(low: tuple[int, int], native: tuple[int, int]) -> None:
    spec = model_spec(labels=2, kind="lesion")
    probs = activate(
        np.random.default_rng(2).normal(0, 2, (3, *low)).astype(np.float32), "softmax", axis=0
    )
    upsample = UpsampledDecision(
        grid_coordinates(low[0], native[0]), low[0], grid_coordinates(low[1], native[1]), low[1]
    )
    labels, conf = upsample(probs, spec)
    want_labels, want_conf = plain(probs, *native, spec)
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(conf, want_conf)
