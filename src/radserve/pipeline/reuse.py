"""A pipeline's upstream steps rebuilt from a result folder of the same study, so a run
that changes one step (a shadow or canary comparison run) runs only that step and the
steps after it.

From the folder's ``report.json`` and label maps, each step before the changed one gets
back what the next steps and the report read of it: its label map on the study's grid
(region steps: the class map as written; finding-only steps: the class map rebuilt from
the numbered findings map), its organ measurements, findings and their axes. Every step
must have run the same model version as the new pipeline names, and each map must lie
on the study's grid; otherwise :class:`ReuseUnavailableError` says why and the caller
runs the whole pipeline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from radserve.domain import Volume
from radserve.errors import PipelineError, RadserveError
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import PipelineSpec
from radserve.pipeline.volume import StepResult
from radserve.report.json_report import read_report
from radserve.report.nifti import read_nifti
from radserve.report.schema import LabelMapOutput, Report

__all__ = ["ReuseUnavailableError", "upstream_steps"]


class ReuseUnavailableError(PipelineError):
    """An earlier result cannot stand in for the upstream steps (run them instead)."""

    code = "reuse_unavailable"


_AFFINE_TOLERANCE_MM = 1e-3


def _map(folder: Path, output: LabelMapOutput, ct: Volume) -> np.ndarray:
    try:
        volume = read_nifti(folder / output.path)
    except RadserveError as exc:
        raise ReuseUnavailableError(f"label map {output.path}: {exc.message}") from exc
    if volume.shape != ct.shape or not np.allclose(
        volume.affine, ct.affine, atol=_AFFINE_TOLERANCE_MM
    ):
        raise ReuseUnavailableError(f"label map {output.path} is not on this study's grid")
    return np.asarray(volume.array)


def upstream_steps(
    result_dir: Path,
    pipeline: PipelineSpec,
    registry: ModelRegistry,
    ct: Volume,
    step_name: str,
) -> list[StepResult]:
    """The steps of ``pipeline`` before ``step_name``, as ``result_dir`` recorded them
    for the study whose volume is ``ct``."""
    names = [s.step_name for s in pipeline.steps]
    if step_name not in names:
        raise PipelineError(f"pipeline {pipeline.name!r} has no step {step_name!r}")
    upstream = pipeline.steps[: names.index(step_name)]
    if not upstream:
        return []
    folder = Path(result_dir)
    try:
        report: Report = read_report(folder / "report.json")
    except (OSError, RadserveError) as exc:
        raise ReuseUnavailableError(f"the result in {folder} cannot be read back: {exc}") from exc
    ran = {m.name: m for m in report.models}
    out: list[StepResult] = []
    for step in upstream:
        bundle = registry.get(step.model, step.version)
        spec = bundle.spec
        run = ran.get(spec.name)
        if run is None or run.version != spec.version:
            found = run.version if run else "nothing"
            raise ReuseUnavailableError(f"the result ran {found} for {spec.key}, not that version")
        maps = [m for m in report.outputs.label_maps if m.step == step.step_name]
        regions = next((m for m in maps if m.kind != "findings"), None)
        numbered = next((m for m in maps if m.kind == "findings"), None)
        findings = [f for f in report.findings if f.model == spec.name]
        finding_labels = None
        if spec.finding_labels:
            if numbered is None:
                raise ReuseUnavailableError(
                    f"the result has no findings map of step {step.step_name}"
                )
            finding_labels = ct.with_array(_map(folder, numbered, ct))
        if spec.region_labels:
            if regions is None:
                raise ReuseUnavailableError(f"the result has no label map of step {step.step_name}")
            labels = ct.with_array(_map(folder, regions, ct))
        else:  # a finding-only step wrote its numbered findings: back to its classes
            assert finding_labels is not None
            values = {label.name: label.value for label in spec.labels}
            lut = np.zeros(int(finding_labels.array.max(initial=0)) + 1, np.uint8)
            for f in findings:
                if f.label_value < lut.size:
                    lut[f.label_value] = values.get(f.label, 0)
            labels = ct.with_array(lut[finding_labels.array])
        ids = {f.finding_id for f in findings}
        out.append(
            StepResult(
                bundle,
                run.precision,
                labels,
                run.execution_provider or "reused",
                organs=[o for o in report.organ_measurements if o.model == spec.name],
                findings=findings,
                finding_labels=finding_labels,
                finding_axes=[a for a in report.finding_axes if a.finding_id in ids],
                step=step,
            )
        )
    return out
