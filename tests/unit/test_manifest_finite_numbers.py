"""YAML reads ``.nan``, ``.inf`` and ``-.inf`` as floats, and a bound such as ``gt=0``
lets infinity through: a model.yaml holding one anywhere (a spacing, a normalisation
value, a threshold, a critical rule) is refused when read, the message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from radserve.errors import ModelError
from radserve.models.manifest import load_manifest

BUNDLE = """
name: m
version: "1.0"
task: detection
modality: CT
input:
  mode: 2d
  spacing: [null, {spacing_y}, 1.0]
  normalisation: {{kind: clip_zscore, lower: -100, upper: {upper}, mean: 0, std: {std}}}
labels:
  - value: 1
    name: nodule
    concept: {{value: "10200004", meaning: Liver}}
    category: {{value: "10200004", meaning: Liver}}
postprocess:
  - op: threshold
    p: {threshold}
critical:
  - label: nodule
    min_volume_ml: {volume}
"""
FINITE = {"spacing_y": "1.0", "upper": "200", "std": "50", "threshold": "0.5", "volume": "10"}


def _read(tmp_path: Path, **values: str) -> object:
    path = tmp_path / "model.yaml"
    path.write_text(BUNDLE.format(**{**FINITE, **values}))
    return load_manifest(path)


def test_finite_numbers_are_read(tmp_path: Path) -> None:
    spec = _read(tmp_path)
    assert spec.input.spacing == (None, 1.0, 1.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("spacing_y", ".nan", "input.spacing[1] is nan"),
        ("upper", ".inf", "input.normalisation.upper is inf"),
        ("std", ".inf", "input.normalisation.std is inf"),  # passes std's gt=0 on its own
        ("threshold", ".NaN", "postprocess[0].p is nan"),
        ("volume", "-.inf", "critical[0].min_volume_ml is -inf"),
    ],
)
def test_a_non_finite_number_is_refused_naming_its_field(
    tmp_path: Path, field: str, value: str, named: str
) -> None:
    assert isinstance(yaml.safe_load(value), float)  # what YAML makes of it
    with pytest.raises(ModelError, match="numbers must be finite") as info:
        _read(tmp_path, **{field: value})
    assert named in str(info.value)
