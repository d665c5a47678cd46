"""Normalisation follows model.yaml's formulas; body bbox skips air and the table."""

from __future__ import annotations

import numpy as np
import pytest

from radserve.domain.volume import Volume
from radserve.models.manifest import ClipZScore, CtWindow, NoNormalisation, RescaleUnit, ZScore
from radserve.preprocess import bbox_of_mask, body_bbox, normalise, normalised_floor, roi_bbox
from radserve.preprocess.crop import nonzero_mask


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


def _mr_like(seed: int = 0) -> np.ndarray:
    """An MR-like crop: a bright ellipsoid with a zero-valued hole and a zero frame."""
    rng = np.random.default_rng(seed)
    z, y, x = np.ogrid[:12, :30, :28]
    image = np.zeros((12, 30, 28), np.float32)
    inside = ((z - 6) / 5.0) ** 2 + ((y - 15) / 12.0) ** 2 + ((x - 14) / 11.0) ** 2 < 1
    image[inside] = rng.normal(300, 40, int(inside.sum())).astype(np.float32)
    image[5:7, 14:16, 13:15] = 0.0  # a hole inside: in nnU-Net's filled mask
    return image


@pytest.mark.parametrize("use_mask", [False, True])
def test_zscore_repeats_nnunets_zscore_normalization(use_mask: bool) -> None:
    """The same float32 numbers as nnU-Net's own class, given its non-zero mask."""
    norm = pytest.importorskip("nnunetv2.preprocessing.normalization.default_normalization_schemes")
    cropping = pytest.importorskip("nnunetv2.preprocessing.cropping.cropping")
    image = _mr_like()
    other = np.zeros_like(image)
    other[0, 0, 0] = 1.0  # a second channel non-zero where the first is not: the union
    data, seg, _ = cropping.crop_to_nonzero(np.stack([image, other]))
    theirs = norm.ZScoreNormalization(use_mask_for_norm=use_mask, intensityproperties={}).run(
        data[0].copy(), seg[0]
    )
    mask = nonzero_mask([data[0], data[1]])
    np.testing.assert_array_equal(mask, seg[0] >= 0)
    ours = normalise(data[0], ZScore(use_mask=use_mask), mask)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    if use_mask:
        assert (ours[~mask] == 0).all() and abs(float(ours[mask].mean())) < 1e-4


def test_rescale_and_none_repeat_nnunet() -> None:
    norm = pytest.importorskip("nnunetv2.preprocessing.normalization.default_normalization_schemes")
    image = _mr_like(1) - 50.0
    for ours_kind, theirs_cls in (
        (RescaleUnit(), norm.RescaleTo01Normalization),
        (NoNormalisation(), norm.NoNormalization),
    ):
        theirs = theirs_cls(use_mask_for_norm=False, intensityproperties={}).run(image.copy())
        np.testing.assert_array_equal(normalise(image, ours_kind), theirs)
        assert normalised_floor(ours_kind) == 0.0


def test_zscore_with_use_mask_needs_the_mask() -> None:
    with pytest.raises(ValueError, match="needs the non-zero mask"):
        normalise(_mr_like(), ZScore(use_mask=True))
    flat = np.full((2, 3, 4), 7.0, np.float32)  # std 0: divided by nnU-Net's 1e-8, no NaN
    assert np.isfinite(normalise(flat, ZScore())).all()


@pytest.mark.parametrize(
    "steps",
    [
        [{"op": "normalize", "nonzero": True}, {"op": "scale", "minv": -1.0, "maxv": 1.0}],
        [{"op": "scale"}, {"op": "normalize"}],  # prostate_mri_anatomy's order
        [{"op": "normalize", "nonzero": True}],
    ],
)
def test_monai_intensity_repeats_monai(steps: list[dict[str, object]]) -> None:
    """``monai_intensity`` against MONAI's own NormalizeIntensity / ScaleIntensity (the
    zero voxels left by ``nonzero``, a constant image, an all-zero image)."""
    torch = pytest.importorskip("torch")
    transforms = pytest.importorskip("monai.transforms")
    from radserve.models.manifest import MonaiIntensity

    def monai(x: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(x.copy())
        for s in steps:
            if s["op"] == "normalize":
                t = transforms.NormalizeIntensity(nonzero=bool(s.get("nonzero")))(t)
            else:
                t = transforms.ScaleIntensity(minv=s.get("minv", 0.0), maxv=s.get("maxv", 1.0))(t)
        return np.asarray(t)

    x = np.random.default_rng(0).normal(40, 300, size=(9, 17, 23)).astype(np.float32)
    x[:3] = 0.0
    spec = MonaiIntensity(steps=steps)  # type: ignore[arg-type]
    for image in (x, np.full_like(x, 7.0), np.zeros_like(x)):
        np.testing.assert_allclose(normalise(image, spec), monai(image), rtol=0, atol=2e-6)
    if steps[0].get("nonzero"):  # the zero voxels: left by both, then scaled alike
        assert (normalise(x, spec)[:3] == monai(x)[:3]).all()
