"""Normalisation follows model.yaml's formulas; body bbox skips air and the table."""

from __future__ import annotations

import numpy as np
import pytest

from radserve.domain.volume import Volume
from radserve.models.manifest import ClipZScore, CtWindow
from radserve.preprocess import bbox_of_mask, body_bbox, normalise, normalised_floor, roi_bbox


def test_ct_window_clips_and_scales_to_unit_range() -> None:
    hu = np.array([-2000, -160, 40, 240, 3000], np.int16)
    out = normalise(hu, CtWindow(center=40, width=400))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-6)
    assert normalised_floor(CtWindow(center=40, width=400)) == 0.0


def test_clip_zscore() -> None:
    x = np.array([-1000.0, 0.0, 100.0, 500.0], np.float32)
    spec = ClipZScore(lower=-100, upper=300, mean=50, std=25)
    out = normalise(x, spec)
    np.testing.assert_allclose(out, [-6.0, -2.0, 2.0, 10.0], atol=1e-6)
    assert normalised_floor(spec) == pytest.approx(-6.0)
    assert x[0] == -1000.0  # input untouched


def _phantom_with_table() -> Volume:
    hu = np.full((20, 96, 128), -1000, np.int16)
    yy, xx = np.mgrid[0:96, 0:128]
    body = ((yy - 45) / 25.0) ** 2 + ((xx - 64) / 40.0) ** 2 <= 1.0
    hu[4:17][:, body] = 40
    hu[:, 80:82, 5:123] = 300  # table: 2 rows (1.6 mm) thick, under the body, all slices
    return Volume.from_geometry(hu, spacing=(2.5, 0.8, 0.8))


def test_body_bbox_excludes_air_and_table() -> None:
    vol = _phantom_with_table()
    bbox = body_bbox(vol, margin_mm=0.0)
    truth = bbox_of_mask(vol.array == 40)
    assert truth is not None
    for got, want, n in zip(bbox, truth, vol.shape, strict=True):
        # Within one downsampling step of the truth, and never cutting the body.
        assert got.start <= want.start and got.stop >= want.stop
        assert want.start - got.start <= 4 and got.stop - want.stop <= 4, (got, want, n)


def test_body_bbox_of_pure_air_is_whole_volume() -> None:
    vol = Volume.from_geometry(np.full((4, 16, 16), -1000, np.int16), spacing=(1, 1, 1))
    assert body_bbox(vol) == (slice(0, 4), slice(0, 16), slice(0, 16))


def test_roi_bbox_grows_by_the_margin_in_mm() -> None:
    labels = np.zeros((10, 20, 20), np.uint8)
    labels[4:6, 8:10, 3:5] = 2
    labels[0, 0, 0] = 1
    vol = Volume.from_geometry(labels, spacing=(2.0, 0.5, 1.0))
    assert roi_bbox(vol, (2,), margin_mm=2.0) == (slice(3, 7), slice(4, 14), slice(1, 7))
    assert roi_bbox(vol, (3,), margin_mm=2.0) is None
