"""Refused settings, gateway overrides and model manifests read one way: no pydantic
"Value error, " prefix, no regex anchors, the field named and the value shown cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from radserve.errors import ModelError, PipelineError
from radserve.gateway.config import ScpConfig
from radserve.gateway.errors import GatewayConfigError
from radserve.models.manifest import load_manifest
from radserve.models.registry import bundled_model_dir
from radserve.pipeline.spec import bundled_pipeline_dir, load_pipeline


def test_a_gateway_override_a_validator_refuses_reads_as_its_own_sentence(
    tmp_path: Path,
) -> None:
    with pytest.raises(GatewayConfigError) as refused:
        ScpConfig(data_dir=tmp_path, ae_title="A" * 17, port=70000)
    message = str(refused.value)
    assert message.startswith("invalid gateway configuration: "), message
    assert "Value error, " not in message  # until session 43 the gateway kept it
    assert "ae_title: " in message and "(got 'AAAAAAAAAAAAAAAAA')" in message, message
    assert "port: Input should be less than or equal to 65535 (got 70000)" in message


def test_a_manifest_value_is_shown_cut_to_80_characters(
    tmp_path: Path,
) -> None:
    shipped = bundled_model_dir() / "organs" / "1.0.0" / "model.yaml"
    manifest = tmp_path / "model.yaml"
    manifest.write_text(shipped.read_text().replace("modality: CT", f"modality: {'c' * 90}", 1))
    with pytest.raises(ModelError) as refused:
        load_manifest(manifest)
    message = str(refused.value)
    assert f"modality: Input should be 'CT', 'MR' or 'PT' (got '{'c' * 76}...)" in message


def test_a_pipeline_pattern_is_said_without_its_anchors(tmp_path: Path) -> None:
    pipeline = tmp_path / "p.yaml"
    shipped = bundled_pipeline_dir() / "ct-organs.yaml"
    pipeline.write_text(
        shipped.read_text().replace("model: organs", "model: organs\n    name: _x", 1)
    )
    with pytest.raises(PipelineError) as refused:
        load_pipeline(pipeline)
    message = str(refused.value)
    assert "name: should match the pattern [A-Za-z0-9][A-Za-z0-9._-]{0,63} (got '_x')" in message
    assert "String should match pattern" not in message, message
