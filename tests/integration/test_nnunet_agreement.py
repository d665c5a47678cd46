"""radserve serving an imported nnU-Net model vs nnU-Net's own predictor, same weights.

The nnU-Net folder is made in the test (tests/factories/nnunet_folder.py: tiny plans,
nnU-Net's random initialisation, two folds), imported with `radserve models import
nnunet`'s function, and both predict the same synthetic CT: ``nnUNetPredictor`` (torch,
in-process, ``predict_single_npy_array``) and radserve (the bundle's ONNX through
ONNX Runtime and ``PatchTask``). Needs the ``nnunet`` extra (tools/install_nnunet.sh).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="the nnunet extra (torch) is not installed")
pytest.importorskip("nnunetv2", reason="the nnunet extra (nnunetv2) is not installed")

from tests.factories.agreement import agreement, radserve_labels, synthetic_ct
from tests.factories.nnunet_folder import make_results_folder, tiny_plans

from radserve.bench.nnunet_model import HU_BANDS
from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from radserve.models.manifest import load_manifest


def nnunet_labels(source, ct: np.ndarray, spacing, *, mirroring: bool) -> np.ndarray:
    predictor = load_predictor(source)
    predictor.use_mirroring = mirroring
    return predictor.predict_single_npy_array(ct[None].astype(np.float32), {"spacing": spacing})


def _transposed() -> dict:
    plans = tiny_plans()
    plans["transpose_forward"], plans["transpose_backward"] = [1, 2, 0], [2, 0, 1]
    return plans


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "plans", "spacing", "shape"),
    [
        # model spacing 2.0 x 1.5 x 1.5: every axis resampled, cubic spline, no separate z
        ("resampled", {}, (2.5, 1.2, 1.3), (30, 72, 70)),
        # 5 mm slices vs 0.9 mm pixels: anisotropic, z resampled apart (nearest)
        ("anisotropic", {"spacing": (4.0, 1.0, 1.0)}, (5.0, 0.9, 0.9), (14, 80, 76)),
        # crop smaller than a patch along z: centred zero padding
        ("padded", {}, (2.0, 1.5, 1.5), (10, 60, 64)),
        # transpose_forward [1, 2, 0] (y, x, z): the network sees transposed arrays
        ("transposed", {"plans": _transposed()}, (1.2, 1.3, 2.5), (72, 30, 70)),
    ],
)
def test_labels_agree_with_nnunet_predictor(tmp_path, case, plans, spacing, shape):
    folder = make_results_folder(tmp_path / "results", **plans)
    bundle = import_nnunet(folder, tmp_path / "models", name="tiny", version=case)
    ct = synthetic_ct(shape)
    ours = radserve_labels(bundle, ct, spacing)
    theirs = nnunet_labels(read_results_folder(folder), ct, spacing, mirroring=False)
    # Random weights still give several classes: the comparison is not all background.
    assert len(np.unique(theirs)) >= 2
    assert agreement(ours, theirs) >= 0.999, (case, agreement(ours, theirs))


@pytest.mark.slow
def test_region_labels_agree_with_nnunet_predictor(tmp_path):
    """Region training (sigmoid heads, regions_class_order): same labels as nnU-Net."""
    folder = make_results_folder(tmp_path / "results", regions=True, folds=(0,))
    bundle = import_nnunet(folder, tmp_path / "models", name="tiny-regions")
    spec = load_manifest(bundle / "model.yaml")
    assert spec.activation == "sigmoid" and spec.channel_values == (1, 2)
    ct, spacing = synthetic_ct((24, 64, 60), seed=3), (2.5, 1.4, 1.4)
    ours = radserve_labels(bundle, ct, spacing)
    theirs = nnunet_labels(read_results_folder(folder), ct, spacing, mirroring=False)
    assert len(np.unique(theirs)) >= 2
    assert agreement(ours, theirs) >= 0.999


@pytest.mark.slow
def test_mirroring_tta_baked_into_the_graph_agrees(tmp_path):
    """--tta: the graph averages all 8 flips per fold; nnU-Net with use_mirroring=True."""
    folder = make_results_folder(tmp_path / "results", folds=(0,))
    plain = import_nnunet(folder, tmp_path / "models", name="tiny", version="1")
    tta = import_nnunet(folder, tmp_path / "models", name="tiny", version="2", tta=True)
    assert load_manifest(tta / "model.yaml").input.test_time_augmentation.cost_factor == 8
    ct, spacing = synthetic_ct((16, 48, 44), seed=4), (2.5, 1.4, 1.4)
    source = read_results_folder(folder)
    theirs_tta = nnunet_labels(source, ct, spacing, mirroring=True)
    ours_tta = radserve_labels(tta, ct, spacing)
    assert agreement(ours_tta, theirs_tta) >= 0.999
    # Without TTA on our side the labels differ from nnU-Net's TTA ones (random weights
    # are not flip-invariant): what the option changes is visible, not assumed.
    assert agreement(radserve_labels(plain, ct, spacing), theirs_tta) < agreement(
        ours_tta, theirs_tta
    )


@pytest.mark.slow
def test_fitted_head_model_agrees(tmp_path):
    """The benchmark's briefly trained model (a linear head fitted to the CT's intensity
    classes on the random body's features, radserve.bench.nnunet_model.fit_head) as a
    tiny folder: imported with its own label names, radserve's labels equal nnU-Net's.
    (How far the head learns the classes needs context: a 16x32x32 patch that is all
    air or all tissue looks the same after instance norm; the benchmark's 128^3 ones
    rarely are.)"""
    ct, spacing = synthetic_ct((24, 72, 72), seed=5), (2.0, 1.5, 1.5)
    folder = make_results_folder(tmp_path / "results", folds=(0,), train_on=ct)
    bundle = import_nnunet(folder, tmp_path / "models", name="tiny-fitted")
    names = [label.name for label in load_manifest(bundle / "model.yaml").labels]
    assert names == list(HU_BANDS)[1:]
    theirs = nnunet_labels(read_results_folder(folder), ct, spacing, mirroring=False)
    assert len(np.unique(theirs)) >= 2
    assert agreement(radserve_labels(bundle, ct, spacing), theirs) >= 0.999


@pytest.mark.slow
def test_briefly_trained_model_learns_and_agrees(tmp_path):
    """The benchmark's ``--weights trained`` model (radserve.bench.nnunet_model.
    train_briefly: the whole network trained a few Adam steps to the CT's intensity
    classes) as a tiny folder: it labels most voxels with their intensity class (it
    learned; a random network's labels match about a quarter), and radserve's labels
    equal nnU-Net's."""
    from radserve.bench.nnunet_model import hu_band_target

    ct, spacing = synthetic_ct((24, 72, 72), seed=5), (2.0, 1.5, 1.5)
    folder = make_results_folder(
        tmp_path / "results", folds=(0,), train_on=ct, train_steps=30, train_lr=1e-2
    )
    theirs = nnunet_labels(read_results_folder(folder), ct, spacing, mirroring=False)
    inside = ct != 0  # the zero frame is outside nnU-Net's crop (background)
    learned = float((theirs[inside] == hu_band_target(ct)[inside]).mean())
    assert learned > 0.8, learned
    bundle = import_nnunet(folder, tmp_path / "models", name="tiny-trained")
    assert agreement(radserve_labels(bundle, ct, spacing), theirs) >= 0.999
