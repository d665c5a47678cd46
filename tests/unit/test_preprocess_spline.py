"""preprocess/spline.py against the functions it reproduces (scikit-image, nnunetv2)."""

from __future__ import annotations

import numpy as np
import pytest

from radserve.preprocess.spline import nnunet_new_shape, resize_channels, separate_axis


def test_separate_axis_follows_nnunets_rule() -> None:
    assert separate_axis((5.0, 0.8, 0.8), (1.0, 1.0, 1.0), 3.0) == 0  # source anisotropic
    assert separate_axis((1.0, 1.0, 1.0), (1.0, 4.0, 1.0), 3.0) == 1  # target anisotropic
    assert separate_axis((2.0, 1.0, 1.0), (1.5, 1.5, 1.5), 3.0) is None
    assert separate_axis((4.0, 4.0, 1.0), (1.0, 1.0, 1.0), 3.0) is None  # two coarsest axes


def test_new_shape_rounds_like_nnunet() -> None:
    assert nnunet_new_shape((30, 72, 70), (2.5, 1.2, 1.3), (2.0, 1.5, 1.5)) == (38, 58, 61)


@pytest.mark.parametrize(
    ("shape", "current", "new", "order", "order_z"),
    [
        ((1, 12, 30, 28), (2.5, 1.2, 1.3), (2.0, 1.5, 1.5), 3, 0),  # no separate axis
        ((1, 8, 40, 36), (5.0, 0.9, 0.9), (4.0, 1.0, 1.0), 3, 0),  # z apart, nearest
        ((2, 8, 40, 36), (5.0, 0.9, 0.9), (2.0, 1.0, 1.0), 1, 1),  # z apart, linear
        ((1, 10, 20, 20), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0), 3, 0),  # nothing to do
    ],
)
def test_resize_channels_matches_nnunets_resampling(shape, current, new, order, order_z) -> None:
    default_resampling = pytest.importorskip(
        "nnunetv2.preprocessing.resampling.default_resampling",
        reason="the nnunet extra is not installed",
    )
    rng = np.random.default_rng(0)
    data = rng.normal(size=shape).astype(np.float32) * 100
    target = nnunet_new_shape(shape[1:], current, new)
    ours = resize_channels(data, target, current, new, order=order, order_z=order_z, separate=True)
    theirs = default_resampling.resample_data_or_seg_to_shape(
        data, target, current, new, is_seg=False, order=order, order_z=order_z,
        force_separate_z=None,
    )  # fmt: skip
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-3)
