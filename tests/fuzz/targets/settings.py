"""Target (d): the YAML/TOML files radserve reads -- a bundle's ``model.yaml``
(:func:`~radserve.models.manifest.load_manifest`), a pipeline file
(:func:`~radserve.pipeline.spec.load_pipeline`) and the settings file
(:func:`~radserve.config.load_settings`, ``.yaml`` and ``.toml``). A site writes them,
an installed bundle brings its own: each must be refused with the file and the field
named (ModelError, PipelineError, ConfigError), never crash a start or an install.

Input layout: byte 0 chooses the loader; the rest is the file's bytes."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from radserve.config import load_settings
from radserve.models.manifest import load_manifest
from radserve.pipeline.spec import bundled_pipeline_dir, load_pipeline
from tests.fuzz.invariant import refusals_only

COVERED = (
    "radserve.config",
    "radserve.models",
    "radserve.pipeline.spec",
    "radserve.yaml_text",
    "radserve.domain.critical",
    "radserve.tls",
)
_FOLDER = Path(tempfile.mkdtemp(prefix="radserve-fuzz-settings-"))
_ASSETS = bundled_pipeline_dir().parent
_REPO = Path(__file__).resolve().parents[3]

LOADERS: tuple[tuple[str, Callable[[Path], object]], ...] = (
    ("model.yaml", load_manifest),
    ("pipeline.yaml", load_pipeline),
    ("radserve.yaml", load_settings),
    ("radserve.toml", load_settings),
)
_TOML_SEED = b"""data_dir = "data"
[server]
port = 8000
[ingest]
missing_slices = "resample"
[scheduler.queue_limits]
routine = 10
"""


def seeds() -> list[bytes]:
    models = sorted((_ASSETS / "models").glob("*/*/model.yaml"))
    pipelines = sorted((_ASSETS / "pipelines").glob("*.yaml"))
    out = [bytes([0]) + p.read_bytes() for p in models]
    out += [bytes([1]) + p.read_bytes() for p in pipelines]
    out.append(bytes([2]) + (_REPO / "deploy" / "radserve.yaml").read_bytes())
    out.append(bytes([3]) + _TOML_SEED)
    return out


def one_input(data: bytes) -> None:
    if not data:
        return
    name, loader = LOADERS[data[0] % len(LOADERS)]
    path = _FOLDER / name
    path.write_bytes(data[1:])
    with refusals_only():
        loader(path)
