"""preprocess/spline.py against the functions it reproduces (scikit-image, nnunetv2)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from radserve.preprocess.spline import (
    nnunet_new_shape,
    resize_channels,
    separate_axis,
    spline_resize,
)


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
        ((1, 14, 18, 22), (1.2, 0.8, 2.0), (1.5, 1.5, 1.5), 3, 0),  # up and down at once
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


@pytest.mark.parametrize(
    ("shape", "target"),
    [((12, 30, 28), (15, 24, 24)), ((20, 40, 36), (31, 57, 20)), ((3, 40, 40), (1, 60, 10)),
     ((30, 50), (41, 17))],
)  # fmt: skip
def test_cubic_resize_one_axis_at_a_time_is_scipys_3d_zoom(shape, target) -> None:
    """The separable cubic spline (4 taps per axis) is ndimage.zoom's tensor-product one
    (4^3 taps), up and down, in 2 and 3 dimensions, to float64 rounding."""
    from scipy import ndimage

    rng = np.random.default_rng(1)
    x = ndimage.gaussian_filter(rng.normal(size=shape), 1.0) * 100 + rng.normal(size=shape)
    zoom = [o / i for o, i in zip(target, shape, strict=True)]
    want = ndimage.zoom(x, zoom, order=3, mode="nearest", grid_mode=True)
    np.clip(want, x.min(), x.max(), out=want)
    got = spline_resize(x, target, 3)
    assert got.shape == want.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11)


@pytest.mark.parametrize("piece_bytes", [8 * 1024, 100_000])
def test_a_volume_cut_into_pieces_on_threads_resizes_to_the_same_numbers(
    monkeypatch: pytest.MonkeyPatch, piece_bytes: int
) -> None:
    """The lines along the resized axis are independent: a volume cut across another axis
    into pieces (small pieces here, as a 512x512x300 CT is cut into 32 MiB ones), resized
    on several threads, gives exactly the numbers of one whole pass."""
    import radserve.preprocess.spline as spline

    rng = np.random.default_rng(2)
    x = rng.normal(size=(21, 37, 30)) * 300
    whole = spline_resize(x, (17, 50, 23), 3)
    monkeypatch.setattr(spline, "_PIECE_BYTES", piece_bytes)
    monkeypatch.setattr(spline, "usable_cores", lambda: 3)
    threads: set[str] = set()
    filter1d = spline.ndimage.spline_filter1d
    # each thread's first piece waits (10 s at most) until a second thread has one: on a
    # loaded host one pool thread could take every piece before another started (CI),
    # which says nothing of whether the pieces can run apart
    second = threading.Event()
    lock = threading.Lock()

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        name = threading.current_thread().name
        with lock:
            first = name not in threads
            threads.add(name)
            if len(threads) > 1:
                second.set()
        if first:
            second.wait(10)
        return filter1d(*args, **kwargs)

    monkeypatch.setattr(spline.ndimage, "spline_filter1d", recording)
    pieces = spline_resize(x, (17, 50, 23), 3)
    np.testing.assert_array_equal(pieces, whole)
    assert all(name.startswith("radserve-spline") for name in threads) and len(threads) > 1
