"""A model.yaml's numbers past what a model can mean are refused when it is read, naming
the field. Session 32 tried each on the bundled organs model with ``radserve run``: a
colour of 300 and ``divisible_by`` of 1e9 were accepted and every study through the
model ended in a traceback (highdicom's RGB check when writing the SEG, numpy's "array is
too big"); a window 1e-300 wide or centred at 1e300 scaled the study to NaN and the run
went on; a target spacing of 1e300 mm, a negative ROI margin and a negative gate
threshold ran as if they meant something."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from radserve.errors import ModelError
from radserve.models.manifest import load_manifest
from radserve.models.registry import bundled_model_dir

ORGANS = bundled_model_dir() / "organs" / "1.0.0" / "model.yaml"
CLIP = {"kind": "clip_zscore", "lower": -100.0, "upper": 200.0, "mean": 0.0, "std": 50.0}


def _with(tmp_path: Path, path: str, value: Any) -> Path:
    data = yaml.safe_load(ORGANS.read_text())
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    last = keys[-1]
    node[int(last) if isinstance(node, list) else last] = copy.deepcopy(value)
    out = tmp_path / "model.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def test_the_bundled_manifest_is_within_every_bound() -> None:
    assert load_manifest(ORGANS).input.divisible_by == 16


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("labels.0.color", [300, 0, 0], "labels.0.color.0"),
        ("labels.0.color", [0, -1, 0], "labels.0.color.1"),
        ("input.divisible_by", 10**9, "input.divisible_by"),
        ("input.normalisation.width", 1e-300, "input.normalisation.ct_window.width"),
        ("input.normalisation.center", 1e300, "input.normalisation.ct_window.center"),
        ("input.normalisation", {**CLIP, "std": 1e-300}, "clip_zscore.std"),
        ("input.normalisation", {**CLIP, "lower": 300.0}, "lower 300 must be below upper 200"),
        ("input.spacing", [None, 1e300, 1.5], "input.spacing.1"),
        ("input.spacing", [None, 1.5, 0.0], "input.spacing.2"),
        ("input.roi_margin_mm", -5.0, "input.roi_margin_mm"),
        ("gate.max_dice_drop", -0.5, "gate.max_dice_drop"),
        ("gate.max_recall_drop_points", 1e300, "gate.max_recall_drop_points"),
    ],
)
def test_a_number_no_model_can_mean_is_refused_naming_its_field(
    tmp_path: Path, path: str, value: Any, named: str
) -> None:
    with pytest.raises(ModelError, match="invalid model manifest") as info:
        load_manifest(_with(tmp_path, path, value))
    assert named in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("labels.0.color", [0, 255, 128]),
        ("input.divisible_by", 1024),
        ("input.normalisation.width", 0.5),  # a narrow window on other units
        ("input.normalisation.center", 5e7),  # PET activity concentration, Bq/ml
        ("input.spacing", [None, 80.0, 80.0]),
        ("input.roi_margin_mm", 0.0),
    ],
)
def test_numbers_a_real_model_may_have_pass(tmp_path: Path, path: str, value: Any) -> None:
    load_manifest(_with(tmp_path, path, value))
