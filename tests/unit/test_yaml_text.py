"""YAML alias bombs ("billion laughs") and deep nesting in the files radserve reads:
refused with a YAML error before the document is constructed, where ``yaml.safe_load``
had returned at once and pydantic then ran for minutes over 9**10 leaves. Ordinary
anchors still load."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from tests.factories.server_process import run_radserve

from radserve.config import ConfigError, load_settings
from radserve.errors import PipelineError
from radserve.models.manifest import ModelError, load_manifest
from radserve.pipeline.spec import load_pipeline
from radserve.yaml_text import load_yaml


def _laughs(levels: int = 10) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join([*lines, f"name: *a{levels - 1}", ""])


def test_a_billion_laughs_model_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_text(_laughs())
    with pytest.raises(ModelError, match="alias bomb"):
        load_manifest(path)


def test_a_billion_laughs_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "radserve.yaml"
    path.write_text(_laughs())
    with pytest.raises(ConfigError, match="alias bomb"):
        load_settings(path)


def test_deep_nesting_is_a_yaml_error() -> None:
    with pytest.raises(yaml.YAMLError):
        load_yaml("[" * 100_000 + "]" * 100_000)


def test_ordinary_anchors_load_as_safe_load_reads_them() -> None:
    text = "base: &base {a: 1, b: [1, 2]}\nx: *base\ny: {<<: *base, b: [3]}\n" + _laughs(3)
    assert load_yaml(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    ("name", "load", "error"),
    [
        ("model.yaml", load_manifest, ModelError),
        ("pipeline.yaml", load_pipeline, PipelineError),
        ("radserve.yaml", load_settings, ConfigError),
        ("radserve.toml", load_settings, ConfigError),
    ],
)
def test_a_file_that_is_not_utf8_is_refused_by_its_loader(
    tmp_path: Path, name: str, load: Callable[[Path], object], error: type[Exception]
) -> None:
    """Found by fuzzing (tests/fuzz settings target): a UnicodeDecodeError escaped."""
    path = tmp_path / name
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))  # é as one byte, 0xe9
    with pytest.raises(error, match=r"(?i)utf-8"):
        load(path)


@pytest.mark.parametrize("text", ["?\n", "1: 2\n", "null: 3\n"])
def test_a_setting_name_that_is_not_text_is_refused(tmp_path: Path, text: str) -> None:
    """Found by fuzzing (tests/fuzz settings target): a YAML key of null or a number at
    the top level became a keyword argument, and a TypeError."""
    path = tmp_path / "radserve.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="setting names must be text"):
        load_settings(path)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "gateway:\n  quiet_s: 3\n   port: 4\n",
            "line 3, column 8: mapping values are not allowed here",
        ),
        (
            "gateway: {quiet_s: [1\n",
            "line 2, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence at line 1, column 20)",
        ),
    ],
)
def test_a_yaml_mistake_is_one_line_naming_where(tmp_path: Path, text: str, said: str) -> None:
    """Through the real command: PyYAML's text quoted the line under a ``^`` that the
    command line's redaction printed as ``<redacted>``, and named the file
    ``"<unicode string>"``."""
    config = tmp_path / "radserve.yaml"
    config.write_text(text)
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    done = run_radserve("config", "show", "--config", str(config), env=clean, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.endswith(f"is not valid YAML: {said}"), line
    assert "<redacted>" not in line and "<unicode string>" not in line


def test_a_key_given_twice_is_refused_where_it_is(tmp_path: Path) -> None:
    """PyYAML kept the second value without a word: a config file whose second
    ``port:`` (or a model.yaml whose second ``activation:``) quietly won."""
    path = tmp_path / "radserve.yaml"
    path.write_text("server:\n  port: 8000\n  host: 127.0.0.1\n  port: 9000\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    assert "line 4, column 3: the key 'port' is given twice (first at line 2, column 3)" in str(
        refused.value
    )
    with pytest.raises(yaml.YAMLError, match="the key 'b' is given twice"):
        load_yaml("- {a: 1}\n- {a: 2, b: [1], c: {d: 1}, b: 3}\n")


def test_merge_keys_and_a_key_in_two_mappings_still_load() -> None:
    text = "base: &base {a: 1}\nx: {<<: *base, a: 2}\ny: {<<: [*base], b: 1}\nz: {a: 1}\n"
    assert load_yaml(text) == yaml.safe_load(text)
