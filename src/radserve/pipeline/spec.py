"""``pipelines/<name>.yaml``: chain models and say which series they apply to.

A pipeline names its model steps in order (organs -> lesions), the default precision,
and series-selection rules on DICOM attributes. Every series a rule rejects is reported
with the rule that rejected it, so a radiographer can see why nothing ran.

Each step has a ``name`` (default: its model's name) and writes one label map,
``<output>.nii.gz`` (``output`` defaults to the name). What a step's labels are (organ,
structure, lesion, finding: ``model.yaml``) decides its post-processing. The rules that
need the models (every model installed, every ROI/mask/``within`` reference satisfied by
an earlier step) are checked by :func:`radserve.pipeline.checks.check_pipeline` when the
pipeline is resolved against a registry.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from radserve.domain.critical import CriticalRule
from radserve.errors import PipelineError
from radserve.models.manifest import Precision
from radserve.validation_text import describe_problems
from radserve.yaml_text import load_yaml_file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SeriesRules(_Strict):
    """Rules a series must pass; an empty list means "any". (What was chosen, and why
    the others were not, is :class:`radserve.report.schema.SeriesSelection`.)"""

    modalities: tuple[str, ...] = ("CT",)
    min_slices: int = Field(1, ge=1)
    max_slice_thickness_mm: float | None = None
    body_parts: tuple[str, ...] = ()
    exclude_image_types: tuple[str, ...] = ("LOCALIZER",)
    series_description: str | None = Field(
        None,
        description=(
            "regular expression the Series Description must match (searched): which of a "
            "multi-sequence MR study's series is the grid, e.g. '(?i)t1' for a T1 + T2 + "
            "FLAIR model whose reference channel is the T1"
        ),
    )
    prefer: Literal["most_slices", "thinnest"] = "thinnest"

    @model_validator(mode="after")
    def _check_description(self) -> SeriesRules:
        if self.series_description is not None:
            try:
                re.compile(self.series_description)
            except re.error as exc:
                raise ValueError(f"series_description is not a regular expression: {exc}") from exc
        return self


_STEM = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Step(_Strict):
    model: str
    version: str | None = None
    name: str | None = Field(None, pattern=_STEM, description="default: the model's name")
    output: str | None = Field(
        None,
        pattern=_STEM,
        description="label map file stem (<output>.nii.gz); default: the step's name",
    )

    @property
    def step_name(self) -> str:
        return self.name or self.model

    @property
    def output_stem(self) -> str:
        return self.output or self.step_name


class PipelineSpec(_Strict):
    name: str
    version: str
    description: str = ""
    series_selection: SeriesRules = SeriesRules()
    steps: tuple[Step, ...] = Field(min_length=1)
    precision: Precision = "fp32"
    # findings pushed to the critical-findings receivers the moment the result exists
    critical: tuple[CriticalRule, ...] = ()

    @model_validator(mode="after")
    def _unique_steps(self) -> PipelineSpec:
        for what, values in (
            ("step name", [s.step_name for s in self.steps]),
            ("output", [s.output_stem for s in self.steps]),
        ):
            seen: dict[str, int] = {}
            for i, value in enumerate(values, start=1):
                if value in seen:
                    raise ValueError(
                        f"rule 'unique {what}s': steps {seen[value]} and {i} both have "
                        f"{what} {value!r}; give one of them its own `name:` or `output:`"
                    )
                seen[value] = i
        return self


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
        names = available_pipelines(directory)
        close = difflib.get_close_matches(str(name_or_path), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(names) or "none"
        raise PipelineError(f"unknown pipeline {str(name_or_path)!r}{hint}; available: {known}")
    try:
        return PipelineSpec.model_validate(load_yaml_file(path))
    except ValidationError as exc:
        raise PipelineError(f"invalid pipeline file {path}: {describe_problems(exc)}") from exc
    except (OSError, yaml.YAMLError) as exc:
        raise PipelineError(f"invalid pipeline file {path}: {exc}") from exc
