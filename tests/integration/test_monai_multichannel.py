"""Multi-sequence MR MONAI Bundles: each input channel read from its own series.

A tiny 3-channel UNet (seeded random weights) in a bundle written in the test, with
MONAI's two ways of stacking channels in its loader (several keys joined by
``ConcatItemsd``; one key given a list of files, BraTS's layout) and
``NormalizeIntensityd(nonzero, channel_wise)``, and the list once more with
``CropForegroundd`` of the stacked image (MONAI's box: any channel above 0). The volumes
are the phantom's T1, T2 and FLAIR (:mod:`radserve.phantom.mr`: one anatomy, grid and
Frame of Reference). MONAI runs the bundle on their NIfTIs as its bundle workflow does;
radserve imports it and runs the T1 with the T2 and FLAIR as channels. Then what cannot
be expressed is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("monai")
pytest.importorskip("torch")

from tests.factories import monai_bundle as mb

from radserve.domain.volume import Volume
from radserve.importers import ImportRefusedError
from radserve.importers.channel_series import SeriesRule
from radserve.importers.monai_bundle import import_monai, manifest_from_monai, read_bundle
from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
from radserve.models.manifest import load_manifest
from radserve.phantom import PhantomSpec, generate_phantom
from radserve.phantom.mr import generate_mr

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)
NAMED = {"0": "T1", "1": "T2", "2": "FLAIR"}
PRE = {
    "concat": mb.MR_CONCAT_PRE,
    "list": mb.MR_LIST_PRE,
    # MONAI's box over the stacked image: voxels above 0 in any channel
    "list_crop_foreground": [*mb.MR_LIST_PRE, {**mb.CROP, "margin": 2}],
}


@pytest.fixture(scope="module")
def sequences() -> dict[str, Volume]:
    """The small phantom of seed 0 as T1, T2 and FLAIR (keys as the bundle's loader)."""
    phantom = generate_phantom(PhantomSpec.random(0, small=True))
    return {key: generate_mr(phantom, key.upper()) for key in mb.SEQUENCE_KEYS}


def monai_inputs(sequences: dict[str, Volume], folder: Path, pattern: str) -> dict[str, Any]:
    """The data dictionary MONAI's loader reads: a NIfTI per key, or a list under one."""
    folder.mkdir(exist_ok=True)
    paths = {k: str(mb.write_nifti(v, folder / f"{k}.nii.gz")) for k, v in sequences.items()}
    return paths if pattern == "concat" else {"image": [paths[k] for k in mb.SEQUENCE_KEYS]}


def _bundle(folder: Path, pre: list[dict[str, Any]], inputs: dict[str, str] = NAMED) -> Path:
    meta = mb.metadata(modality="MR", inputs=inputs)
    return mb.write_monai_bundle(folder, pre=pre, network=mb.MR_NETWORK, meta=meta)


@pytest.mark.parametrize("pattern", list(PRE))
def test_multi_sequence_bundle_agrees_with_monai(
    tmp_path: Path, sequences: dict[str, Volume], pattern: str
) -> None:
    bundle = _bundle(tmp_path / "bundle", PRE[pattern])
    out = import_monai(bundle, tmp_path / "models", name="mr", version="1")
    spec = load_manifest(out / "model.yaml")
    assert spec.modality == "MR" and spec.input.reference == "t1"
    assert (spec.input.crop_foreground is not None) == pattern.endswith("crop_foreground")
    assert [(c.name, c.modality) for c in spec.input.channels] == [
        ("t1", "MR"),
        ("t2", "MR"),
        ("flair", "MR"),
    ]
    assert all(c.normalisation.kind == "monai_intensity" for c in spec.input.channels)
    want = mb.run_monai_bundle(bundle, monai_inputs(sequences, tmp_path, pattern)).labels

    session = ModelSession(out / "model.onnx", spec, runtime=CPU)

    def radserve(flair: np.ndarray) -> np.ndarray:
        images = {"t2": sequences["t2"].array, "flair": flair}
        task = PatchTask(sequences["t1"], spec, image_channels=images)
        return run_task(task, session).labels.array

    got = radserve(sequences["flair"].array)
    counts = np.bincount(want.ravel(), minlength=3)
    assert (counts > 0.005 * want.size).sum() >= 2, counts  # not one class everywhere
    agreement = float((got == want).mean())
    print(
        f"{pattern}: agreement {agreement:.5f} ({int((got != want).sum())} of {want.size} differ)"
    )
    assert agreement >= 0.999, agreement
    # every channel is read: the labels move without the FLAIR
    without = float((radserve(np.zeros_like(sequences["flair"].array)) == want).mean())
    assert without < agreement - 0.001, (agreement, without)


def _spec(tmp_path: Path, pre: list[dict[str, Any]], **kwargs: Any) -> Any:
    folder = _bundle(tmp_path / "bundle", pre, **kwargs)
    return manifest_from_monai(read_bundle(folder), name="mr", version="1")


def test_channel_names_that_say_no_series_need_the_channel_option(tmp_path: Path) -> None:
    unnamed = {"0": "a", "1": "b", "2": "c"}
    with pytest.raises(ImportRefusedError, match=r"channel 0 is named 'a'.*--channel 0="):
        _spec(tmp_path, mb.MR_CONCAT_PRE, inputs=unnamed)
    rules = {0: SeriesRule("MR", "(?i)t1"), 1: SeriesRule("MR", "(?i)t2"), 2: SeriesRule("MR")}
    source = read_bundle(tmp_path / "bundle")
    spec = manifest_from_monai(source, name="mr", version="1", channels=rules)
    assert [c.series_description for c in spec.input.channels] == ["(?i)t1", "(?i)t2", None]


REFUSED = {
    "pooled_normalisation": (
        [*mb.MR_CONCAT_PRE[:5], {**mb.MR_CONCAT_PRE[5], "channel_wise": False}],
        NAMED,
        r"NormalizeIntensityd without channel_wise=True on 3 channels",
    ),
    "transform_before_stacking": (
        [
            *mb.MR_CONCAT_PRE[:2],
            {"_target_": "ScaleIntensityd", "keys": mb.SEQUENCE_KEYS},
            *mb.MR_CONCAT_PRE[2:],
        ],
        NAMED,
        r"preprocessing\[2\] ScaleIntensityd on the stacked keys \['t1', 't2', 'flair'\]",
    ),
    "concat_in_space": (
        [*mb.MR_CONCAT_PRE[:2], {**mb.MR_CONCAT_PRE[2], "dim": 1}, *mb.MR_CONCAT_PRE[3:]],
        NAMED,
        r"ConcatItemsd dim 1",
    ),
    "channel_count": (
        mb.MR_CONCAT_PRE,
        {"0": "T1", "1": "T2"},
        r"gives the input 2 channel\(s\), ConcatItemsd stacks 3 keys",
    ),
    "crop_foreground_of_one_channel": (
        [*mb.MR_LIST_PRE, {**mb.CROP, "channel_indices": [0]}],
        NAMED,
        r"CropForegroundd: channel_indices",
    ),
    "one_series_twice": (
        mb.MR_LIST_PRE,
        {"0": "T1", "1": "T1w", "2": "FLAIR"},
        r"channels 0 and 1 would both be read from the MR series",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_multi_channel_refused_by_name(tmp_path: Path, case: str) -> None:
    pre, inputs, reason = REFUSED[case]
    with pytest.raises(ImportRefusedError, match=reason):
        _spec(tmp_path, pre, inputs=inputs)


def test_the_channel_option_on_a_one_channel_bundle_is_refused(tmp_path: Path) -> None:
    folder = mb.write_monai_bundle(tmp_path / "bundle")
    with pytest.raises(ImportRefusedError, match="this bundle has one channel"):
        import_monai(folder, tmp_path / "models", channels={1: SeriesRule("MR")})
