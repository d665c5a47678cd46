"""nnU-Net plans -> model.yaml mapping and refusals (no torch needed: JSON only)."""

from __future__ import annotations

import json
import re

import pytest
from tests.factories.nnunet_folder import CONFIG, FOLDER, tiny_dataset, tiny_plans

from radserve.importers import ImportRefusedError
from radserve.importers.channel_series import SeriesRule, parse_channel_option
from radserve.importers.nnunet import manifest_from_nnunet, read_results_folder
from radserve.models.manifest import ModelSpec


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
        (_plans(patch_size=[64, 64]), None, "neither 2d nor 3d"),
        # numbers that are not what they say: before 2026-12-08 read silently (16.5 as 16,
        # "2" as 2, true as a 1 mm spacing) or a traceback (a number for the list)
        (_plans(patch_size=[16, 32.5, 32]), None, "patch_size .* give whole numbers"),
        (_plans(patch_size=16), None, "patch_size is 16: give a list of numbers"),
        (_plans(spacing=["2", 1.5, 1.5]), None, "spacing .* give a list of numbers"),
        (_plans(spacing=[True, 1.5, 1.5]), None, "spacing .* give a list of numbers"),
        ({**tiny_plans(), "transpose_forward": ["x", 1, 2]}, None, "transpose_forward is"),
        (_plans(patch_size={"a": 1}), None, "patch_size is {'a': 1}: give a list"),

        ({**tiny_plans(), "image_reader_writer": "NaturalImage2DIO"}, None,
         "'NaturalImage2DIO'.* not 2D images"),
        ({k: v for k, v in tiny_plans().items() if k != "image_reader_writer"},
         {**tiny_dataset(), "overwrite_image_reader_writer": "SimpleITKIOWithReorient"},
         "SimpleITKIOWithReorient reorients"),
        (_plans(normalization_schemes=["RGBTo01Normalization"]), None, "'RGBTo01Normalization'"),
        (_plans(normalization_schemes=["MyNormalization"]), None, "channel 0 normalization 'My"),
        (
            _plans(normalization_schemes=["CTNormalization"] * 2),
            None,
            "names 1 channel\\(s\\), the plans normalise 2",
        ),
        (_plans(previous_stage="3d_lowres"), None, "cascade"),
        (_plans(preprocessor_name="MyPreprocessor"), None, "MyPreprocessor"),
        (_plans(resampling_fn_data="resample_torch_fornnunet"), None, "resample_torch_fornnunet"),
        (
            _plans(resampling_fn_data_kwargs={"is_seg": False, "order": 3, "order_z": 0,
                                              "force_separate_z": True}),
            None,
            "force_separate_z=True",
        ),
        (None, {**tiny_dataset(), "channel_names": {"0": "noNorm"}}, "channel 0 is named 'noNorm'"),
        (None, {**tiny_dataset(), "labels": {"background": 0, "a": 2}}, "consecutive"),
    ],
)  # fmt: skip
def test_inexpressible_models_are_refused_by_name(tmp_path, plans, dataset, reason):
    with pytest.raises(ImportRefusedError, match=reason.replace("[", r"\[")):
        _spec(tmp_path, plans=plans, dataset=dataset)


def test_a_2d_configuration_is_a_depth_one_3d_window_on_native_slices(tmp_path):
    """nnU-Net's 2d: each slice along the first (transposed) axis, resampled in-plane."""
    spec = _spec(tmp_path, plans=_plans(patch_size=[64, 48], spacing=[0.8, 0.7]))
    assert spec.input.mode == "3d" and spec.input.patch_size == (1, 64, 48)
    assert spec.input.spacing == (None, 0.8, 0.7) and spec.input.overlap == 0.5


def test_totalsegmentator_style_dataset_json(tmp_path):
    """Many labels sharing long name prefixes get distinct codes within DICOM's 16
    characters; NibabelIO (the same arrays as SimpleITKIO) and file_ending are accepted."""
    names = ["background"] + [
        f"{part}_{side}"
        for part in ("subclavian_artery", "lung_upper_lobe", "iliac_vena", "rib")
        for side in ("left", "right")
    ] + [f"rib_left_{i}" for i in range(1, 13)]  # fmt: skip
    dataset = {
        **tiny_dataset(),
        "labels": {n: i for i, n in enumerate(names)},
        "file_ending": ".nii.gz",
        "overwrite_image_reader_writer": "NibabelIO",
    }
    plans = {**tiny_plans(), "image_reader_writer": "NibabelIO"}
    spec = _spec(tmp_path, plans=plans, dataset=dataset)
    codes = [label.concept.value for label in spec.labels]
    assert spec.num_classes == len(names) and len(set(codes)) == len(codes)
    assert all(len(c) <= 16 for c in codes) and "iliac-vena-left" in codes
    assert {c for c in codes if c.startswith("subclavian")} == {
        "subclavian-art-1", "subclavian-art-2",
    }  # fmt: skip


def test_a_reorienting_reader_gives_patient_direction_axes(tmp_path):
    """NibabelIOWithReorient (TotalSegmentator's): arrays in RAS+ order read as (S, A, R),
    then transpose_forward."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    plans = {**tiny_plans(), "image_reader_writer": "NibabelIOWithReorient"}
    assert _spec(tmp_path / "a", plans=plans).input.axes == ("S", "A", "R")
    plans |= {"transpose_forward": [2, 0, 1], "transpose_backward": [1, 2, 0]}
    assert _spec(tmp_path / "b", plans=plans).input.axes == ("R", "S", "A")


def test_fold_all_and_another_checkpoint(tmp_path):
    folder = _folder(tmp_path, folds=("all",))
    assert read_results_folder(folder).folds == ("all",)
    (folder / "fold_all" / "checkpoint_best.pth").write_bytes(b"not read here")
    (folder / "fold_all" / "checkpoint_final.pth").unlink()
    with pytest.raises(ImportRefusedError, match=r"\['checkpoint_best.pth'\] \(--checkpoint"):
        read_results_folder(folder)
    assert read_results_folder(folder, checkpoint="checkpoint_best.pth").folds == ("all",)


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


def _two_channel(names=("CT", "PET"), schemes=("CTNormalization", "ZScoreNormalization")):
    plans = tiny_plans(schemes=schemes)
    return plans, tiny_dataset(channels=len(names), channel_names=names)


def test_a_ct_pet_model_maps_each_channel_to_its_series_and_normalisation(tmp_path):
    plans, dataset = _two_channel()
    spec = _spec(tmp_path, plans=plans, dataset=dataset)
    ct, pet = spec.input.channels
    assert spec.modality == "CT" and spec.input.reference_channel.name == "ct"
    assert (ct.modality, ct.units, ct.normalisation.kind) == ("CT", "native", "clip_zscore")
    assert (ct.normalisation.lower, ct.normalisation.mean) == (-900.0, 40.0)
    assert (pet.modality, pet.units, pet.normalisation.kind) == ("PT", "SUVbw", "zscore")
    assert spec.input.in_channels == 2 and spec.input.crop == "nonzero"


def test_a_pet_first_model_keeps_its_channel_order_on_the_ct_grid(tmp_path):
    plans, dataset = _two_channel(
        names=("PET", "CT"), schemes=("NoNormalization", "CTNormalization")
    )
    spec = _spec(tmp_path, plans=plans, dataset=dataset)
    assert [c.name for c in spec.input.channels] == ["pet", "ct"]
    assert spec.input.reference == "ct" and spec.modality == "CT"
    assert spec.input.channels[0].normalisation.kind == "none"
    # channel 1's CT normalisation reads channel 1's fingerprint
    assert spec.input.channels[1].normalisation.mean == 50.0


def test_mr_sequences_are_told_apart_by_their_series_description(tmp_path):
    names = ("T2", "ADC", "FLAIR", "T1Gd")
    plans = tiny_plans(schemes=("ZScoreNormalization",) * 4, use_mask=(True, False, True, False))
    dataset = tiny_dataset(channels=4, channel_names=names)
    spec = _spec(tmp_path, plans=plans, dataset=dataset)
    rules = {c.name: re.compile(c.series_description) for c in spec.input.channels}
    assert spec.modality == "MR" and list(rules) == ["t2", "adc", "flair", "t1gd"]
    assert [c.normalisation.use_mask for c in spec.input.channels] == [True, False, True, False]
    picks = {
        "t2": ["T2 TSE AX"],
        "adc": ["ep2d_diff ADC"],
        "flair": ["AX T2 FLAIR"],
        "t1gd": ["T1 MPRAGE post Gd"],
    }
    series = ["T2 TSE AX", "ep2d_diff ADC", "AX T2 FLAIR", "T1 MPRAGE post Gd", "T1 MPRAGE"]
    for name, rule in rules.items():
        assert [d for d in series if rule.search(d)] == picks[name], name


def test_a_one_channel_mr_zscore_model_with_the_nonzero_mask(tmp_path):
    plans = tiny_plans(schemes=("ZScoreNormalization",), use_mask=(True,))
    spec = _spec(tmp_path, plans=plans, dataset=tiny_dataset(channel_names=("T2",)))
    assert spec.modality == "MR" and not spec.input.channels
    assert spec.input.normalisation.kind == "zscore" and spec.input.normalisation.use_mask


def test_a_pet_only_model_reads_its_pet_in_suv_as_the_grid(tmp_path):
    """nnU-Net PET models are trained on SUV: a one-channel PET model declares its one
    channel (read in SUVbw, not the series' Bq/ml), and two PET channels (e.g. an
    attenuation-corrected and an uncorrected series) take the first as the grid."""
    spec = _spec(tmp_path, dataset={**tiny_dataset(), "channel_names": {"0": "PET"}})
    assert spec.modality == "PT"
    assert [(c.modality, c.units) for c in spec.input.channels] == [("PT", "SUVbw")]
    assert spec.input.reference_channel.name == spec.input.channels[0].name
    plans, dataset = _two_channel(names=("PET", "SUV"))
    (tmp_path / "two").mkdir()
    source = read_results_folder(_folder(tmp_path / "two", plans=plans, dataset=dataset))
    rules = {1: SeriesRule("PT", "(?i)nac")}
    two = manifest_from_nnunet(source, name="t", version="1", channels=rules)
    assert two.modality == "PT" and two.input.reference_channel is two.input.channels[0]
    assert [c.units for c in two.input.channels] == ["SUVbw", "SUVbw"]
    assert two.input.channels[1].series_description == "(?i)nac"


@pytest.mark.parametrize(
    ("names", "channels", "reason"),
    [
        (("CT", "noNorm"), None, r"channel 1 is named 'noNorm'.*--channel 1=PT"),
        (("T1", "T1w"), None, r"channels 0 and 1 would both be read from the MR series"),
        (("CT", "PET"), {2: SeriesRule("PT")}, r"channel\(s\) \[2\]"),
    ],
)
def test_channels_that_say_no_series_are_refused_naming_the_option(
    tmp_path, names, channels, reason
):
    plans, dataset = _two_channel(names=names)
    source = read_results_folder(_folder(tmp_path, plans=plans, dataset=dataset))
    with pytest.raises(ImportRefusedError, match=reason):
        manifest_from_nnunet(source, name="t", version="1", channels=channels)


def test_the_channel_option_names_the_series(tmp_path):
    plans, dataset = _two_channel(names=("CT", "noNorm"))
    source = read_results_folder(_folder(tmp_path, plans=plans, dataset=dataset))
    rules = dict(parse_channel_option(t) for t in ["1=MR:(?i)flair"])
    spec = manifest_from_nnunet(source, name="t", version="1", channels=rules)
    assert spec.input.channels[1].modality == "MR"
    assert spec.input.channels[1].series_description == "(?i)flair"
    for bad in ("x=PT", "1=pet", "1", "1=MR:(unclosed"):
        with pytest.raises(ImportRefusedError, match="--channel"):
            parse_channel_option(bad)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"mode": "2d", "patch_size": None, "resampling": None, "crop": "none",
             "sliding_window": {}, "axes": ["z", "y", "x"]},
            "normalisation 'zscore' takes its numbers from the whole image",
        ),
        ({"crop": "none"}, "zscore use_mask .* needs crop 'nonzero'"),
        ({"resampling": None}, "zscore use_mask .* needs crop 'nonzero'"),
    ],
)  # fmt: skip
def test_per_image_normalisations_are_refused_where_they_cannot_be_exact(tmp_path, change, reason):
    plans = tiny_plans(schemes=("ZScoreNormalization",), use_mask=(True,))
    spec = _spec(tmp_path, plans=plans, dataset=tiny_dataset(channel_names=("T2",)))
    raw = spec.model_dump(mode="json")
    raw["input"].update(change)
    raw["input"].pop("test_time_augmentation")
    with pytest.raises(ValueError, match=reason):
        ModelSpec.model_validate(raw)


@pytest.mark.parametrize(
    ("plans_text", "reason"),
    [
        (None, "NaN and Infinity are JavaScript's"),  # a NaN spacing (json.dumps writes NaN)
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("[1, 2]", "plans.json is not a JSON object"),
    ],
)
def test_plans_that_are_not_a_finite_json_object_are_refused(tmp_path, plans_text, reason):
    """Python's json reads NaN, and a NaN spacing had gone into model.yaml as is; deep
    nesting had raised RecursionError out of the importer."""
    folder = _folder(tmp_path)
    if plans_text is None:
        plans = tiny_plans()
        plans["configurations"][CONFIG]["spacing"][0] = float("nan")
        plans_text = json.dumps(plans)
    (folder / "plans.json").write_text(plans_text)
    with pytest.raises(ImportRefusedError, match=reason):
        read_results_folder(folder)


def test_a_configuration_that_inherits_from_itself_is_refused(tmp_path):
    plans = tiny_plans()
    plans["configurations"][CONFIG]["inherits_from"] = CONFIG
    with pytest.raises(ImportRefusedError, match="inherit in a circle"):
        _spec(tmp_path, plans=plans)


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda p, d: p.update(configurations=[CONFIG]), "TypeError"),
        (lambda p, d: d.update(labels={"background": 0, "liver": "one"}), "ValueError"),
        (lambda p, d: p["configurations"][CONFIG].update(resampling_fn_data_kwargs=[3]),
         "AttributeError"),
    ],
)  # fmt: skip
def test_json_of_another_shape_is_refused_naming_the_files(tmp_path, edit, error):
    """Found by fuzzing (tests/fuzz importers target): these raised from the mapping."""
    plans, dataset = tiny_plans(), tiny_dataset()
    edit(plans, dataset)
    with pytest.raises(ImportRefusedError, match=rf"plans.json: not the structure .*\({error}"):
        _spec(tmp_path, plans=plans, dataset=dataset)
