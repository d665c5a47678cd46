"""A refused ``model.yaml`` or pipeline file reads as one line per problem: the field, the
reason and the value given, as docs/model-ops.md's ops are written.

Found following docs/model-ops.md (2026-12-07): its example's finding ops on an organ
model were refused by ``radserve models install`` with pydantic's own text, several lines
of ``[type=value_error, input_value={'name': 'organs', 'versi...}, input_type=dict]`` and
"For further information visit https://errors.pydantic.dev/...", naming the install's
staging copy (``.../models/.staging/.install.<owner>.part/bundle/model.yaml``), a
folder gone by the time the refusal is read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from radserve.errors import BundleRejectedError, ModelError, PipelineError
from radserve.lifecycle.install import inspect_bundle
from radserve.models.manifest import load_manifest
from radserve.models.registry import bundled_model_dir
from radserve.pipeline.spec import load_pipeline

PYDANTIC_TEXT = ("[type=", "input_value=", "errors.pydantic.dev", "validation error for", "\n")


def organs_bundle(tmp_path: Path, **changes: object) -> Path:
    bundle = tmp_path / "organs"
    shutil.copytree(bundled_model_dir() / "organs" / "1.0.0", bundle)
    manifest = bundle / "model.yaml"
    data = yaml.safe_load(manifest.read_text())
    data.update(changes)
    manifest.write_text(yaml.safe_dump(data))
    return bundle


FINDING_OPS = [{"op": "threshold", "p": 0.5}, {"op": "min_confidence", "value": 0.8}]


def _refusal(bundle: Path) -> str:
    """What loading the bundle's manifest refuses it with, none of pydantic's own text."""
    with pytest.raises(ModelError) as info:
        load_manifest(bundle / "model.yaml")
    text = str(info.value)
    assert not [part for part in PYDANTIC_TEXT if part in text], text
    return text


def test_a_check_over_the_file_is_its_reason_alone(tmp_path: Path) -> None:
    text = _refusal(organs_bundle(tmp_path, postprocess=FINDING_OPS))
    assert "postprocess[1] (min_confidence) applies to findings" in text, text


def test_a_field_names_itself_and_the_value_given(tmp_path: Path) -> None:
    bundle = organs_bundle(tmp_path)
    data = yaml.safe_load((bundle / "model.yaml").read_text())
    data["input"]["mode"] = "4d"
    (bundle / "model.yaml").write_text(yaml.safe_dump(data))
    text = _refusal(bundle)
    assert "input.mode: Input should be '2d', '2.5d' or '3d' (got '4d')" in text, text


def test_an_install_refusal_names_the_bundles_file_not_a_staging_path(tmp_path: Path) -> None:
    bundle = organs_bundle(tmp_path, postprocess=FINDING_OPS)
    with pytest.raises(BundleRejectedError) as info:
        inspect_bundle(bundle)
    text = info.value.message
    assert text.startswith("invalid model manifest model.yaml (in the bundle): "), text
    assert str(tmp_path) not in text, text


def test_a_pipeline_file_lists_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline(path)
    text = str(info.value)
    assert text.endswith("version: Field required; steps: Field required"), text
    assert not [part for part in PYDANTIC_TEXT if part in text], text


def test_an_unknown_pipeline_suggests_the_closest_name() -> None:
    """``radserve run --pipeline ct-organz`` listed what exists but suggested nothing, where
    models and settings say "did you mean"."""
    with pytest.raises(PipelineError) as info:
        load_pipeline("ct-organz")
    text = str(info.value)
    assert "unknown pipeline 'ct-organz' (did you mean 'ct-organs'?); available: " in text, text
