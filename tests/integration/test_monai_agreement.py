"""``radserve models import monai-bundle``: labels agree with MONAI's own run of the bundle.

A tiny MONAI Bundle is built in the test (a real inference.json in the shape of the
model zoo's spleen_ct_segmentation, a 3D UNet with seeded random weights); MONAI runs it
as its bundle workflow does (preprocessing, SlidingWindowInferer, postprocessing with
Invertd) on a NIfTI written from the volume; radserve imports it and runs the bundle it
wrote through the 3D sliding window. Then the things it cannot express are refused.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("monai")
pytest.importorskip("torch")

from tests.factories import monai_bundle as mb

from radserve.domain.volume import Volume
from radserve.importers import ImportRefusedError
from radserve.importers.monai_bundle import import_monai
from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
from radserve.models.manifest import load_manifest

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)
SAGITTAL = np.array([[1.0, 0, 0], [0, 0, 1.0], [0, -1.0, 0]])
_C, _S = np.cos(0.2), np.sin(0.2)
TILTED = np.array([[1.0, 0, 0], [0, _C, -_S], [0, _S, _C]])  # an 11.5 degree gantry tilt


def _ct(
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    *,
    zero_outside: bool = False,
    **geo: Any,
) -> Volume:
    """A smooth random volume; ``zero_outside``: exactly 0 outside an ellipsoid body,
    as skull-stripped MR (what ``NormalizeIntensity(nonzero)`` sees)."""
    from scipy import ndimage

    field = ndimage.gaussian_filter(np.random.default_rng(0).normal(size=shape), 2.0)
    hu = (50 + 1200 * field).astype(np.int16)
    if zero_outside:
        z, y, x = np.ogrid[tuple(slice(0, n) for n in shape)]
        r = sum(((c - (n - 1) / 2) / (0.4 * n)) ** 2 for c, n in zip((z, y, x), shape, strict=True))
        hu = np.where(r <= 1.0, np.abs(hu) + 1, 0).astype(np.int16)
    return Volume.from_geometry(hu, spacing=spacing, origin=(10.0, -20.0, 30.0), **geo)


def _post_activation_after_invert() -> list[dict[str, Any]]:
    return [mb.POST[1], mb.POST[0], *mb.POST[2:]]


CASES = {
    # spleen-bundle shape: RAS, 1.5x1.5x2 mm bilinear, window clip, gaussian 0.5 overlap
    "spleen_shape": ({}, ((40, 64, 72), (2.5, 0.9, 0.9), {})),
    "intensity_before_spacing": (
        {"pre": [*mb.PRE[:3], mb.PRE[4], mb.PRE[3], mb.PRE[5]]},
        ((40, 64, 72), (2.5, 0.9, 0.9), {}),
    ),
    "axcodes_PLI": (
        {"pre": [*mb.PRE[:2], {**mb.PRE[2], "axcodes": "PLI"}, *mb.PRE[3:]]},
        ((40, 64, 72), (2.5, 0.9, 0.9), {}),
    ),
    "softmax_after_invertd": (
        {"post": _post_activation_after_invert()},
        ((40, 64, 72), (2.5, 0.9, 0.9), {}),
    ),
    "constant_blend_overlap_025": (
        {"inferer": {**mb.INFERER, "mode": "constant", "overlap": 0.25}},
        ((40, 64, 72), (2.5, 0.9, 0.9), {}),
    ),
    # source spacings dividing the model's (0.75 -> 1.5 mm, 3 -> 6 mm): every 2nd model
    # voxel lands exactly on a native one
    "exact_ratio_075_3": (
        {"pre": [*mb.PRE[:3], {**mb.PRE[3], "pixdim": [1.5, 1.5, 6.0]}, *mb.PRE[4:]]},
        ((40, 80, 88), (3.0, 0.75, 0.75), {}),
    ),
    # the MR bundles' Spacingd([4, 4, 6]) + NormalizeIntensityd(nonzero) on a body in
    # exact zeros at 3 mm (every 3rd / 2nd model voxel on a native one): a model voxel on
    # a zero just past the body reads the body's last voxel with a weight of ~1e-16, so
    # MONAI counts it as non-zero (73 such voxels here)
    "exact_ratio_nonzero_normalise": (
        {"pre": mb.MR_LIST_PRE},
        ((48, 80, 80), (3.0, 3.0, 3.0), {"zero_outside": True}),
    ),
    "smaller_than_patch_padded": ({}, ((12, 30, 50), (2.0, 1.1, 0.8), {})),
    "sagittal_series": ({}, ((36, 50, 60), (1.2, 1.0, 1.3), {"direction": SAGITTAL})),
    "segresnet_sigma_025": (
        {
            "network": {
                "_target_": "SegResNet",
                "spatial_dims": 3,
                "in_channels": 1,
                "out_channels": 3,
                "init_filters": 8,
                "blocks_down": [1, 1],
                "blocks_up": [1],
            },
            "inferer": {**mb.INFERER, "sigma_scale": 0.25, "overlap": 0.6},
        },
        ((30, 48, 56), (1.7, 1.2, 1.2), {}),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_labels_agree_with_monai_bundle_inference(tmp_path: Path, case: str) -> None:
    config, (shape, spacing, geo) = CASES[case]
    bundle = mb.write_monai_bundle(tmp_path / "bundle", **config)
    volume = _ct(shape, spacing, **geo)
    want = mb.run_monai_reference(bundle, mb.write_nifti(volume, tmp_path / "ct.nii.gz"))

    out = import_monai(bundle, tmp_path / "models", name="tiny", version="1.0.0")
    spec = load_manifest(out / "model.yaml")
    got = run_task(PatchTask(volume, spec), ModelSession(out / "model.onnx", spec, runtime=CPU))

    assert got.labels.same_geometry(volume)
    counts = np.bincount(want.ravel(), minlength=3)
    assert (counts > 0.005 * want.size).sum() >= 2, counts  # not one class everywhere
    agreement = float((got.labels.array == want).mean())
    print(f"{case}: radserve vs MONAI {agreement:.7f}")
    assert agreement >= 0.999, agreement


@pytest.mark.slow
def test_pet_bundle_reads_its_pet_in_suv_and_agrees_with_monai(tmp_path: Path) -> None:
    """A bundle whose input modality is PET (before: refused) declares its one channel in
    SUVbw, the units PET models are trained on, so the server converts the series; run
    on SUV values it labels as MONAI does."""
    pre = [*mb.PRE[:4], {**mb.PRE[4], "a_min": 0.0, "a_max": 12.0}, mb.PRE[5]]
    meta = mb.metadata(modality="PET")
    bundle = mb.write_monai_bundle(tmp_path / "bundle", pre=pre, meta=meta)
    ct = _ct((30, 48, 56), (3.0, 2.0, 2.0))
    suv = ct.with_array(np.clip(ct.array.astype(np.float32) / 150.0 + 2.0, 0.0, None))
    want = mb.run_monai_reference(bundle, mb.write_nifti(suv, tmp_path / "pet.nii.gz"))
    out = import_monai(bundle, tmp_path / "models", name="tiny-pet", version="1.0.0")
    spec = load_manifest(out / "model.yaml")
    assert spec.modality == "PT"
    assert [(c.modality, c.units) for c in spec.input.channels] == [("PT", "SUVbw")]
    got = run_task(PatchTask(suv, spec), ModelSession(out / "model.onnx", spec, runtime=CPU))
    counts = np.bincount(want.ravel(), minlength=3)
    assert (counts > 0.005 * want.size).sum() >= 2, counts  # not one class everywhere
    agreement = float((got.labels.array == want).mean())
    assert agreement >= 0.999, agreement


_CROP = mb.CROP
# MONAI's CropForegroundd after ScaleIntensityRanged (spleen_ct_segmentation's place), on
# a body in air (-1000 HU: below a_min, so outside MONAI's box); (crop options, other
# config, CT shape, spacing, air in the first two slices too, direction).
CROP_CASES: dict[
    str,
    tuple[dict[str, Any], dict[str, Any], tuple[int, ...], tuple[float, ...], bool, Any],
] = {
    "default": ({}, {}, (40, 64, 72), (2.5, 0.9, 0.9), False, None),
    "margin_k_divisible_softmax_after_invertd": (
        {"margin": [3, 0, 5], "k_divisible": [16, 16, 8]},
        {"post": _post_activation_after_invert()},
        (40, 64, 72),
        (2.5, 0.9, 0.9),
        False,
        None,
    ),
    "margin_past_the_image": ({"margin": 20}, {}, (40, 64, 72), (2.5, 0.9, 0.9), False, None),
    "margin_allow_smaller": (
        {"margin": [2, 20, 4], "allow_smaller": True},  # 20: clamped to the image
        {},
        (40, 64, 72),
        (2.5, 0.9, 0.9),
        False,
        None,
    ),
    "box_smaller_than_patch": ({}, {}, (12, 30, 50), (2.0, 1.1, 0.8), False, None),
    # 1.2 -> 1.5 mm: every 5th native row maps exactly onto a model voxel (the ties);
    # 2.5 -> 2 mm: every 4th slice, the box starting beside one (session 9: 0.98666)
    "exact_ties": ({}, {}, (24, 64, 64), (2.5, 1.2, 1.2), True, None),
    "exact_ties_softmax_after_invertd": (
        {},
        {"post": _post_activation_after_invert()},
        (24, 64, 64),
        (2.5, 1.2, 1.2),
        True,
        None,
    ),
    # an oblique series: MONAI's grid varies by ulps across rows (monai_grid._exact_rows)
    "gantry_tilt": ({}, {}, (24, 64, 64), (2.5, 1.2, 1.2), True, TILTED),
    # 1.0 -> 1.5 mm (every 3rd row) and 3.0 -> 2.0 mm (every 2nd slice) on a sagittal series
    "exact_ties_sagittal_k_divisible": (
        {"k_divisible": 4},
        {},
        (30, 48, 45),
        (1.0, 1.0, 3.0),
        True,
        SAGITTAL,
    ),
}


def _crop_spec(options: dict[str, Any]) -> Any:
    from radserve.models.manifest import CropForegroundSpec

    def three(v: Any) -> tuple[int, int, int]:
        return tuple(int(x) for x in np.broadcast_to(v, 3))  # type: ignore[return-value]

    return CropForegroundSpec(
        margin=three(options.get("margin", 0)),
        k_divisible=three(options.get("k_divisible", 1)),
        allow_smaller=bool(options.get("allow_smaller", False)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CROP_CASES))
def test_crop_foreground_vs_monai(tmp_path: Path, case: str) -> None:
    from tests.factories.agreement import synthetic_ct

    options, config, shape, spacing, air_slices, direction = CROP_CASES[case]
    cropped = mb.cropped_pre(**options)
    bundle = mb.write_monai_bundle(tmp_path / "bundle", pre=cropped, **config)
    ct = synthetic_ct(shape, seed=3)
    ct[:, :, :3] = -1000.0  # air beside the body
    if air_slices:
        ct[:2] = -1000.0
    geo = {} if direction is None else {"direction": direction}
    volume = Volume.from_geometry(ct, spacing=spacing, origin=(0.0, 0.0, 0.0), **geo)
    want = mb.run_monai_reference(bundle, mb.write_nifti(volume, tmp_path / "ct.nii.gz"))

    out = import_monai(bundle, tmp_path / "models", name="tiny", version="1.0.0")
    spec = load_manifest(out / "model.yaml")
    assert spec.input.crop_foreground == _crop_spec(options)
    session = ModelSession(out / "model.onnx", spec, runtime=CPU)
    got = run_task(PatchTask(volume, spec), session).labels.array
    uncropped = spec.model_copy(
        update={"input": spec.input.model_copy(update={"crop_foreground": None})}
    )
    without = float((run_task(PatchTask(volume, uncropped), session).labels.array == want).mean())
    differ = int((got != want).sum())
    agreement = 1.0 - differ / want.size
    print(f"{case}: agreement {agreement:.5f} ({differ} differ); without the crop {without:.5f}")
    assert without < agreement - 0.01  # the crop is exercised
    assert agreement >= 0.999, agreement


_NEAREST_POST = [mb.POST[0], {**mb.POST[1], "nearest_interp": True}, *mb.POST[2:]]
_NEAREST_PRE = [*mb.PRE[:3], {**mb.PRE[3], "mode": "nearest"}, *mb.PRE[4:]]
# MONAI's nearest resampling with pixdim (1.5, 1.5, 2.0) RAS: (config, CT shape, spacing
# (z, y, x), direction, CropForegroundd). Half-voxel ties (native voxel i reads model
# voxel k + 1/2): 2.5 -> 2 mm every 4th slice, 3 -> 2 mm and 1 -> 2 mm every 2nd slice,
# 0.75 -> 1.5 mm every 2nd row/column; Spacing itself (model voxel j reads native
# j + 1/2) at 1 -> 1.5 mm every 2nd row/column.
NEAREST_CASES: dict[str, tuple[dict[str, Any], tuple[int, ...], tuple[float, ...], Any, bool]] = {
    "invertd_ties_2p5_to_2mm": (
        {"post": _NEAREST_POST},
        (40, 48, 56),
        (2.5, 1.2, 1.2),
        None,
        False,
    ),
    "invertd_ties_every_axis": (
        {"post": _NEAREST_POST},
        (24, 64, 64),
        (3.0, 0.75, 0.75),
        None,
        False,
    ),
    # Invertd(nearest_interp=False) resamples back with Spacing's own mode: nearest
    "spacing_nearest_ties_both_ways": (
        {"pre": _NEAREST_PRE},
        (30, 40, 40),
        (1.0, 1.0, 1.0),
        None,
        False,
    ),
    "softmax_after_invertd": (
        {"post": [_NEAREST_POST[1], _NEAREST_POST[0], *_NEAREST_POST[2:]]},
        (24, 64, 64),
        (3.0, 0.75, 0.75),
        None,
        False,
    ),
    # MONAI's label inversion: argmax on the model grid, the label map back by nearest
    "argmax_before_invertd": (
        {"post": [_NEAREST_POST[0], _NEAREST_POST[2], _NEAREST_POST[1], _NEAREST_POST[3]]},
        (24, 64, 64),
        (3.0, 0.75, 0.75),
        None,
        False,
    ),
    "axcodes_PLI": (
        {"pre": [*mb.PRE[:2], {**mb.PRE[2], "axcodes": "PLI"}, *mb.PRE[3:]], "post": _NEAREST_POST},
        (24, 64, 64),
        (3.0, 0.75, 0.75),
        None,
        False,
    ),
    "sagittal_series": ({"post": _NEAREST_POST}, (30, 48, 45), (1.0, 1.0, 3.0), SAGITTAL, False),
    "smaller_than_patch": ({"post": _NEAREST_POST}, (12, 30, 50), (2.0, 0.75, 1.0), None, False),
    # oblique: the float32 affine's spacings move the half-voxel ties off the half (the
    # tie count is not asserted), MONAI's grid varies by ulps across rows
    "gantry_tilt": ({"post": _NEAREST_POST}, (24, 64, 64), (2.5, 0.75, 0.75), TILTED, False),
    "gantry_tilt_crop_foreground": (
        {"post": _NEAREST_POST},
        (24, 64, 64),
        (2.5, 1.2, 1.2),
        TILTED,
        True,
    ),
    # the box's zero padding and the half-voxel ties together
    "crop_foreground": ({"post": _NEAREST_POST}, (24, 64, 64), (2.5, 0.75, 0.75), None, True),
}


def _ties(volume: Volume, spec: Any) -> tuple[int, int, int]:
    """Native voxels reading the model grid, on some axis, at MONAI's coordinates: exactly
    at k + 1/2; within 1e-9 of it (where nearest's pick is decided by the last bits); and
    picking another voxel than the exact value (rounded to 1e-6) would, half to even."""
    from radserve.preprocess.monai_grid import back_coordinates, forward_coordinates

    args = (volume.nifti_affine(), volume.shape[::-1], "".join(spec.input.axes))
    _, shape = forward_coordinates(*args, spec.input.spacing)
    coords, _ = back_coordinates(*args, spec.input.spacing, ((0, 0, 0), shape))
    exact = [np.abs(c - np.floor(c) - 0.5) == 0 for c in coords]
    near = [np.abs(c - np.floor(c) - 0.5) < 1e-9 for c in coords]
    flipped = [np.rint(c) != np.rint(np.round(c, 6)) for c in coords]

    def count(per_axis: list[np.ndarray]) -> int:
        hit = per_axis[0][:, None, None] | per_axis[1][None, :, None] | per_axis[2][None, None, :]
        return int(hit.sum())

    return count(exact), count(near), count(flipped)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(NEAREST_CASES))
def test_nearest_resampling_vs_monai(tmp_path: Path, case: str) -> None:
    """MONAI's nearest ``Invertd`` (and ``Spacing``): radserve picks the voxel
    ``grid_sample`` picks, half-voxel ties included."""
    from tests.factories.agreement import synthetic_ct

    config, shape, spacing, direction, crop = NEAREST_CASES[case]
    if crop:
        config = {**config, "pre": mb.cropped_pre()}
    bundle = mb.write_monai_bundle(tmp_path / "bundle", **config)
    geo = {} if direction is None else {"direction": direction}
    if crop:
        ct = synthetic_ct(shape, seed=3)
        ct[:, :, :3] = -1000.0  # air beside the body: the box inside the image
        ct[:2] = -1000.0
        volume = Volume.from_geometry(ct, spacing=spacing, origin=(0.0, 0.0, 0.0), **geo)
    else:
        volume = _ct(shape, spacing, **geo)
    want = mb.run_monai_reference(bundle, mb.write_nifti(volume, tmp_path / "ct.nii.gz"))

    out = import_monai(bundle, tmp_path / "models", name="tiny", version="1.0.0")
    spec = load_manifest(out / "model.yaml")
    assert spec.input.resampling is not None and spec.input.resampling.output_order == 0
    assert (spec.input.crop_foreground is not None) == crop
    got = run_task(PatchTask(volume, spec), ModelSession(out / "model.onnx", spec, runtime=CPU))

    counts = np.bincount(want.ravel(), minlength=3)
    assert (counts > 0.005 * want.size).sum() >= 2, counts  # not one class everywhere
    exact, near, flipped = _ties(volume, spec)
    differ = int((got.labels.array != want).sum())
    agreement = 1.0 - differ / want.size
    print(
        f"{case}: agreement {agreement:.5f} ({differ} differ); ties {exact} exact, "
        f"{near} within 1e-9, {flipped} picked off the exact value's voxel"
    )
    if direction is not TILTED:
        assert near > 0.05 * want.size  # the ties are exercised
    assert agreement >= 0.999, agreement


def test_imported_manifest_states_the_bundle(tmp_path: Path) -> None:
    bundle = mb.write_monai_bundle(tmp_path / "bundle")
    spec = load_manifest(import_monai(bundle, tmp_path / "models") / "model.yaml")
    i = spec.input
    assert spec.name == "tiny-ct-segmentation" and spec.modality == "CT"
    assert i.axes == ("R", "A", "S") and i.spacing == (1.5, 1.5, 2.0)
    assert i.patch_size == (32, 32, 32) and i.overlap == 0.5 and i.crop == "none"
    assert i.normalisation.kind == "ct_window"
    assert (i.normalisation.center, i.normalisation.width) == (53.5, 221.0)
    assert i.resampling is not None and i.resampling.grid == "first_voxel"
    assert (i.resampling.image_order, i.resampling.output_order) == (1, 1)
    assert not i.resampling.normalise_first
    w = i.sliding_window
    assert (w.importance, w.sigma_scale, w.placement, w.pad) == (
        "monai_gaussian",
        0.125,
        "monai",
        "centre_zero",
    )
    assert w.accumulate == "logits" and w.activate_on_model_grid
    assert [(lb.value, lb.name) for lb in spec.labels] == [(1, "liver"), (2, "spleen")]


def _with(pre: dict[int, dict[str, Any] | None] | None = None, **config: Any) -> dict[str, Any]:
    transforms = copy.deepcopy(mb.PRE)
    for index, t in (pre or {}).items():
        transforms[index] = t  # type: ignore[call-overload]
    return {"pre": [t for t in transforms if t is not None], **config}


_CROP_MARGIN = {**_CROP, "margin": 4, "allow_smaller": True}
REFUSALS = {
    "CropForegroundd_before_intensity": (
        {"pre": [*mb.PRE[:4], _CROP_MARGIN, *mb.PRE[4:]]},
        "preprocessing\\[4\\] CropForegroundd before preprocessing\\[5\\] ScaleIntensityRanged: "
        "CropForeground\\(d\\) is mapped after Spacing\\(d\\) and every intensity transform",
    ),
    "CropForegroundd_before_normalize": (
        {
            "pre": [
                *mb.PRE[:4],
                _CROP_MARGIN,
                {"_target_": "NormalizeIntensityd", "keys": "image"},
                mb.PRE[5],
            ]
        },
        "preprocessing\\[4\\] CropForegroundd before preprocessing\\[5\\] NormalizeIntensityd",
    ),
    "CropForegroundd_before_spacing": (
        {"pre": [*mb.PRE[:3], _CROP_MARGIN, *mb.PRE[3:]]},
        "preprocessing\\[3\\] CropForegroundd before preprocessing\\[4\\] Spacingd",
    ),
    "CropForegroundd_select_fn": (
        _with({5: {**_CROP, "select_fn": "$lambda x: x > 0.5"}}),
        "CropForegroundd: select_fn <lambda> \\(only MONAI's default is_positive",
    ),
    "CropForegroundd_edge_padding": (
        _with({5: {**_CROP, "mode": "edge", "margin": 2}}),  # margin 0: MONAI never pads
        "CropForegroundd: padding mode 'edge' value 0 with a box that may pass the image",
    ),
    "NormalizeIntensityd_subtrahend": (
        _with({4: {"_target_": "NormalizeIntensityd", "keys": "image", "subtrahend": 40.0}}),
        "NormalizeIntensityd: subtrahend/divisor",
    ),
    "range_and_normalize": (
        {"pre": [*mb.PRE[:5], {"_target_": "NormalizeIntensityd", "keys": "image"}, mb.PRE[5]]},
        "ScaleIntensityRange together with another intensity transform",
    ),
    "intensity_both_sides_of_spacing": (
        {
            "pre": [
                *mb.PRE[:3],
                {"_target_": "ScaleIntensityd", "keys": "image"},
                mb.PRE[3],
                {"_target_": "NormalizeIntensityd", "keys": "image"},
            ]
        },
        "intensity transforms on both sides of Spacing",
    ),
    "no_intensity": (_with({4: None}), "no intensity transform"),
    "invertd_other_key": (
        {"post": [mb.POST[0], {**mb.POST[1], "orig_keys": "label"}, *mb.POST[2:]]},
        "Invertd orig_keys 'label'",
    ),
    "replicate_after_crop": (
        {"pre": mb.cropped_pre(), "inferer": {**mb.INFERER, "padding_mode": "replicate"}},
        "padding_mode replicate after CropForeground",
    ),
    "cast_to_int": (
        _with({5: {"_target_": "CastToTyped", "keys": "image", "dtype": "$torch.int16"}}),
        "CastToTyped casts to torch.int16",
    ),
    "clip_false": (_with({4: {**mb.PRE[4], "clip": False}}), "clip=False"),
    "no_orientation": (_with({2: None}), "no Orientation\\(d\\)"),
    "spline_spacing": (_with({3: {**mb.PRE[3], "mode": 3}}), "mode 3 \\(bilinear or nearest"),
    "align_corners": (_with({3: {**mb.PRE[3], "align_corners": True}}), "align_corners True"),
    "argmax_before_bilinear_invertd": (
        {"post": [mb.POST[0], mb.POST[2], mb.POST[1], mb.POST[3]]},
        "AsDiscrete\\(argmax\\) before a bilinear Invertd",
    ),
    "no_invertd": ({"post": [mb.POST[0], mb.POST[2]]}, "no Invertd"),
    "sigmoid": (
        {"post": [{**mb.POST[0], "softmax": False, "sigmoid": True}, *mb.POST[1:]]},
        "sigmoid",
    ),
    "keep_largest": (
        {"post": [*mb.POST[:3], {"_target_": "KeepLargestConnectedComponentd", "keys": "pred"}]},
        "KeepLargestConnectedComponentd is not expressible",
    ),
    "simple_inferer": ({"inferer": {"_target_": "SimpleInferer"}}, "SimpleInferer"),
    "reflect_padding": (
        {"inferer": {**mb.INFERER, "padding_mode": "reflect"}},
        "padding_mode 'reflect'",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_inexpressible_bundles_are_refused_by_name(tmp_path: Path, case: str) -> None:
    config, message = REFUSALS[case]
    bundle = mb.write_monai_bundle(tmp_path / "bundle", **config)
    with pytest.raises(ImportRefusedError, match=message):
        import_monai(bundle, tmp_path / "models")
    assert not (tmp_path / "models").exists()  # refused before anything is written


def test_weights_that_do_not_fit_leave_nothing_in_the_models_folder(tmp_path: Path) -> None:
    """Refused once the import has begun writing (the network is rebuilt and loaded after
    the transforms are mapped): the models folder is as it was, with no version folder,
    no staging folder, and not even itself where it did not exist."""
    import torch

    bundle = mb.write_monai_bundle(tmp_path / "bundle")
    torch.save({"not.a.weight": torch.zeros(1)}, bundle / "models" / "model.pt")
    with pytest.raises(ImportRefusedError, match="does not fit network_def"):
        import_monai(bundle, tmp_path / "models", name="misfit", version="1")
    assert not (tmp_path / "models").exists()
    kept = tmp_path / "kept"
    (kept / "other" / "1").mkdir(parents=True)
    with pytest.raises(ImportRefusedError, match="does not fit network_def"):
        import_monai(bundle, kept, name="misfit", version="1")
    assert [p.relative_to(kept).as_posix() for p in sorted(kept.rglob("*"))] == [
        "other",
        "other/1",
    ]


def test_missing_files_are_named(tmp_path: Path) -> None:
    bundle = mb.write_monai_bundle(tmp_path / "bundle")
    (bundle / "models" / "model.pt").unlink()
    with pytest.raises(ImportRefusedError, match=r"no models/model\.pt or models/model\.ts"):
        import_monai(bundle, tmp_path / "models")
    with pytest.raises(ImportRefusedError, match="no configs/ folder"):
        import_monai(tmp_path, tmp_path / "models")
