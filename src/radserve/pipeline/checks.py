"""The rules a pipeline must meet against the installed models, checked when it is loaded.

A pipeline YAML can be valid on its own and still not run: a step names a model that is
not installed, or a model restricts itself to labels no earlier step produces. These are
refused before any study is read, each with a message naming the rule it breaks, so a
model author fixes the YAML instead of reading a failed job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radserve.domain.critical import CriticalRule
from radserve.errors import PipelineError, UnknownModelError
from radserve.models.registry import ModelBundle, ModelRegistry
from radserve.pipeline.spec import PipelineSpec, Step


@dataclass(frozen=True)
class RegionSource:
    """Where an upstream region label comes from: the step (index) and its value."""

    step: int
    step_name: str
    value: int
    full_grid: bool  # False: the step ran on an ROI, its label map covers only that box


def region_sources(steps: list[tuple[Step, ModelBundle]]) -> dict[str, list[RegionSource]]:
    """Every region label (organ/structure) the given steps produce, by name."""
    out: dict[str, list[RegionSource]] = {}
    for i, (step, bundle) in enumerate(steps):
        for label in bundle.spec.region_labels:
            source = RegionSource(
                i, step.step_name, label.value, full_grid=not bundle.spec.input.roi_labels
            )
            out.setdefault(label.name, []).append(source)
    return out


def check_pipeline(pipeline: PipelineSpec, registry: ModelRegistry) -> list[ModelBundle]:
    """The bundle of every step, after checking the rules; raises on the first broken one.

    Rules: *installed models* (every step's model and version is in the registry);
    *modality* (every model reads a modality the series selection accepts); *upstream
    labels* (each name in a model's ``input.roi_labels``, ``input.extra_channels``, its
    labels' ``within`` and, for a model without region labels, its ``input_domain``
    structures is a region label of exactly one earlier step); *upstream labels on
    the whole grid* (ROI and mask references name a step that did not itself run on an
    ROI); *one within source* (a model's ``within`` names all come from one earlier step).

    Raises:
        UnknownModelError: a step's model or version is not installed.
        PipelineError: any other rule.
    """
    resolved: list[tuple[Step, ModelBundle]] = []
    accepted = pipeline.series_selection.modalities
    for number, step in enumerate(pipeline.steps, start=1):
        where = f"pipeline {pipeline.name!r} step {number} ({step.step_name!r})"
        try:
            bundle = registry.get(step.model, step.version)
        except UnknownModelError as exc:
            raise UnknownModelError(f"rule 'installed models': {where}: {exc.message}") from exc
        spec = bundle.spec
        if accepted and spec.modality not in accepted:
            raise PipelineError(
                f"rule 'modality': {where}: model {spec.key} reads {spec.modality}, but "
                f"series_selection.modalities accepts only {list(accepted)}"
            )
        sources = region_sources(resolved)
        references = [("input.roi_labels", name) for name in spec.input.roi_labels] + [
            ("input.extra_channels", name) for name in spec.input.extra_channels
        ]
        references += [
            (f"labels[{label.name}].within", name)
            for label in spec.finding_labels
            for name in label.within
        ]
        if spec.input_domain is not None and not spec.region_labels:
            references += [
                (f"input_domain.{field}", name)
                for field, name in spec.input_domain.named_structures()
            ]
        for field, name in references:
            found = sources.get(name, [])
            if len(found) == 1 and not found[0].full_grid and field.startswith("input."):
                raise PipelineError(
                    f"rule 'upstream labels on the whole grid': {where}: {field} names "
                    f"{name!r}, from step {found[0].step_name!r}, which ran on an ROI; "
                    "ROI boxes and mask channels need a label map of the whole volume"
                )
            if len(found) == 1:
                continue
            if not found:
                have = sorted(sources) or "none (it is the first step, or no earlier step "
                "has organ/structure labels)"
                raise PipelineError(
                    f"rule 'upstream labels': {where}: model {spec.key} {field} names "
                    f"{name!r}, which no earlier step produces as an organ/structure label; "
                    f"earlier steps produce: {have}"
                )
            steps = [s.step_name for s in found]
            raise PipelineError(
                f"rule 'upstream labels': {where}: {field} names {name!r}, which steps "
                f"{steps} all produce; the reference is ambiguous (give the labels "
                "distinct names in their model.yaml)"
            )
        within = {name for label in spec.finding_labels for name in label.within}
        within_steps = {sources[name][0].step_name for name in within}
        if len(within_steps) > 1:
            raise PipelineError(
                f"rule 'one within source': {where}: model {spec.key}'s `within` labels "
                f"come from steps {sorted(within_steps)}; they must all come from one step"
            )
        resolved.append((step, bundle))
    _check_critical(pipeline, [bundle for _, bundle in resolved])
    return [bundle for _, bundle in resolved]


def _check_critical(pipeline: PipelineSpec, bundles: list[ModelBundle]) -> None:
    """Rule *critical labels*: each of the pipeline's ``critical:`` rules names a finding
    label (kind lesion/finding) of one of its steps' models (``model:``, when given,
    names a step's model), so that a typo is refused instead of never pushing."""
    for i, rule in enumerate(pipeline.critical):
        problem = critical_rule_problem(rule, bundles, "no step")
        if problem is not None:
            where = f"rule 'critical labels': pipeline {pipeline.name!r} critical[{i}]"
            raise PipelineError(f"{where} {problem}")


def critical_rule_problem(
    rule: CriticalRule, bundles: Sequence[ModelBundle], none: str = "no installed model"
) -> str | None:
    """Why ``rule`` can never fire on the findings of ``bundles``' models (its ``model:``
    is none of them, or none of them has its label as a finding label), or None. A
    pipeline's rules are refused on it; the site's ``critical.rules``, which no model
    declares, are reported by ``radserve doctor`` and at each start (session 31: a
    label typed wrong there never pushed, without a word)."""
    produced = {(b.spec.name, label.name) for b in bundles for label in b.spec.finding_labels}
    models = sorted({b.spec.name for b in bundles})
    if rule.model is not None and rule.model not in models:
        return f"names model {rule.model!r}, which {none} runs; they run {models or 'none'}"
    if not any(label == rule.label and rule.model in (None, m) for m, label in produced):
        labels = sorted({label for m, label in produced if rule.model in (None, m)})
        return (
            f"names label {rule.label!r}, which {none} produces as a finding label "
            f"(kind lesion/finding); they produce: {labels or 'none'}"
        )
    return None


__all__ = ["RegionSource", "check_pipeline", "critical_rule_problem", "region_sources"]
