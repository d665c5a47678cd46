"""nnU-Net plans -> model.yaml mapping and refusals (no torch needed: JSON only)."""

from __future__ import annotations

import json

import pytest
from tests.factories.nnunet_folder import CONFIG, FOLDER, tiny_dataset, tiny_plans

from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import manifest_from_nnunet, read_results_folder


def _folder(tmp_path, plans=None, dataset=None, folds=(0,)):
    folder = tmp_path / FOLDER
    folder.mkdir()
    (folder / "plans.json").write_text(json.dumps(plans or tiny_plans()))
    (folder / "dataset.json").write_text(json.dumps(dataset or tiny_dataset()))
    for f in folds:
        (folder / f"fold_{f}").mkdir()
        (folder / f"fold_{f}" / "checkpoint_final.pth").write_bytes(b"not read here")
    return folder


def _spec(tmp_path, **kwargs):
    return manifest_from_nnunet(
        read_results_folder(_folder(tmp_path, **kwargs)), name="t", version="1"
    )


def test_plans_map_onto_model_yaml(tmp_path):
    spec = _spec(tmp_path)
    inp = spec.input
    assert inp.mode == "3d" and inp.patch_size == (16, 32, 32) and inp.spacing == (2.0, 1.5, 1.5)
    assert (inp.normalisation.lower, inp.normalisation.upper) == (-900.0, 600.0)
    assert (inp.normalisation.mean, inp.normalisation.std) == (40.0, 180.0)
    assert inp.crop == "nonzero" and inp.overlap == 0.5
    assert inp.resampling.image_order == 3 and inp.resampling.output_order == 1
    assert inp.resampling.separate_z == "auto" and inp.resampling.normalise_first
    assert inp.sliding_window.importance == "gaussian_filter"
    assert inp.sliding_window.accumulate == "logits" and inp.sliding_window.pad == "centre_zero"
    assert spec.activation == "softmax" and [x.name for x in spec.labels] == [
        "liver", "spleen", "lesion",
    ]  # fmt: skip
    assert spec.num_classes == 4


def test_regions_map_to_sigmoid_heads_in_class_order(tmp_path):
    spec = _spec(tmp_path, dataset=tiny_dataset(regions=True))
    assert spec.activation == "sigmoid" and spec.channel_values == (1, 2) and spec.num_classes == 2
    assert {x.value: x.name for x in spec.labels} == {1: "kidney", 2: "tumour"}


def _plans(**config):
    plans = tiny_plans()
    plans["configurations"][CONFIG].update(config)
    return plans


@pytest.mark.parametrize(
    ("plans", "dataset", "reason"),
    [
        ({**tiny_plans(), "transpose_forward": [2, 1, 1]}, None, "transpose_forward"),
        ({**tiny_plans(), "transpose_forward": [1, 2, 0]}, None, "transpose_backward"),
        (_plans(patch_size=[64, 64]), None, "not 3d"),
        (_plans(normalization_schemes=["ZScoreNormalization"]), None, "ZScoreNormalization"),
        (_plans(normalization_schemes=["CTNormalization"] * 2), None, "2 input channels"),
        (_plans(previous_stage="3d_lowres"), None, "cascade"),
        (_plans(preprocessor_name="MyPreprocessor"), None, "MyPreprocessor"),
        (_plans(resampling_fn_data="resample_torch_fornnunet"), None, "resample_torch_fornnunet"),
        (
            _plans(resampling_fn_data_kwargs={"is_seg": False, "order": 3, "order_z": 0,
                                              "force_separate_z": True}),
            None,
            "force_separate_z=True",
        ),
        (_plans(use_mask_for_norm=[True]), None, "use_mask_for_norm"),
        (None, {**tiny_dataset(), "channel_names": {"0": "T2"}}, "'T2'"),
        (None, {**tiny_dataset(), "labels": {"background": 0, "a": 2}}, "consecutive"),
    ],
)  # fmt: skip
def test_inexpressible_models_are_refused_by_name(tmp_path, plans, dataset, reason):
    with pytest.raises(ImportRefusedError, match=reason.replace("[", r"\[")):
        _spec(tmp_path, plans=plans, dataset=dataset)


def test_not_a_trainer_folder_or_missing_fold(tmp_path):
    with pytest.raises(ImportRefusedError, match="trainer folder"):
        read_results_folder(tmp_path)
    folder = _folder(tmp_path)
    with pytest.raises(ImportRefusedError, match=r"fold\(s\) \['3'\]"):
        read_results_folder(folder, folds=("3",))


def test_transpose_forward_becomes_the_network_axes(tmp_path):
    plans = {**tiny_plans(), "transpose_forward": [1, 2, 0], "transpose_backward": [2, 0, 1]}
    spec = _spec(tmp_path, plans=plans)
    assert spec.input.axes == ("y", "x", "z")
    assert spec.input.spacing == tuple(plans["configurations"][CONFIG]["spacing"])
