"""``pipelines/<name>.yaml``: chain models and say which series they apply to.

A pipeline names its model steps in order (organs -> lesions), the default precision,
and series-selection rules on DICOM attributes. Every series a rule rejects is reported
with the rule that rejected it, so a radiographer can see why nothing ran.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radserve.errors import PipelineError
from radserve.models.manifest import Precision


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeriesSelection(_Strict):
    """Rules a series must pass; an empty list means "any"."""

    modalities: tuple[str, ...] = ("CT",)
    min_slices: int = Field(1, ge=1)
    max_slice_thickness_mm: float | None = None
    body_parts: tuple[str, ...] = ()
    exclude_image_types: tuple[str, ...] = ("LOCALIZER",)
    prefer: Literal["most_slices", "thinnest"] = "thinnest"


class Step(_Strict):
    model: str
    version: str | None = None


class PipelineSpec(_Strict):
    name: str
    version: str
    description: str = ""
    series_selection: SeriesSelection = SeriesSelection()
    steps: tuple[Step, ...] = Field(min_length=1)
    precision: Precision = "fp32"


def bundled_pipeline_dir() -> Path:
    return Path(str(resources.files("radserve") / "assets" / "pipelines"))


def available_pipelines(directory: Path | None = None) -> list[str]:
    directory = directory or bundled_pipeline_dir()
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_pipeline(name_or_path: str | Path, directory: Path | None = None) -> PipelineSpec:
    """Load a pipeline by name (from the pipeline folder) or by path to its YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = (directory or bundled_pipeline_dir()) / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(available_pipelines(directory)) or "none"
        raise PipelineError(f"unknown pipeline {str(name_or_path)!r}; available: {known}")
    try:
        return PipelineSpec.model_validate(yaml.safe_load(path.read_text()))
    except (yaml.YAMLError, ValidationError) as exc:
        raise PipelineError(f"invalid pipeline file {path}: {exc}") from exc
