"""Critical findings a pipeline or model declares: which findings must be pushed to a
person at once (``critical:`` in the pipeline YAML or model.yaml).

One rule names a finding label and, optionally, the size or confidence from which that
finding is critical; a rule without thresholds makes any finding of that label critical::

    critical:
      - {label: liver_lesion, min_long_axis_mm: 20}
      - {kind: finding, label: bleed}

Three places declare rules and they only ever add to one another (a union: a finding is
critical when it meets ANY rule; no source can remove or relax another's rule): the
model's ``model.yaml`` (scoped to that model's findings: ``model`` is filled in), the
pipeline YAML, and the site's ``critical.rules`` setting. :func:`declared_rules` merges
them in that order (site, pipeline, model); a notice names the first rule its finding
meets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from radserve.domain.findings import Finding


class CriticalRule(BaseModel):
    """A finding of ``label`` is critical when it meets every threshold given."""

    # min_long_axis_mm: .inf was a rule that never fires
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["finding"] = "finding"
    label: str = Field(min_length=1)
    min_long_axis_mm: float | None = Field(default=None, gt=0)
    min_volume_ml: float | None = Field(default=None, gt=0)
    min_confidence: float | None = Field(default=None, ge=0, le=1)
    # only findings of this model (a model.yaml's own rules get its name; a site rule
    # may set it); None: any model's findings with this label
    model: str | None = Field(default=None, min_length=1)

    def matches(self, finding: Finding) -> bool:
        if finding.label != self.label:
            return False
        if self.model is not None and finding.model != self.model:
            return False
        axis = self.min_long_axis_mm
        if axis is not None and finding.longest_diameter_mm < axis:
            return False
        if self.min_volume_ml is not None and finding.volume_ml < self.min_volume_ml:
            return False
        return self.min_confidence is None or finding.confidence >= self.min_confidence

    def describe(self) -> str:
        parts = [f"label {self.label}"]
        if self.model is not None:
            parts.append(f"model {self.model}")
        if self.min_long_axis_mm is not None:
            parts.append(f"long axis >= {self.min_long_axis_mm:g} mm")
        if self.min_volume_ml is not None:
            parts.append(f"volume >= {self.min_volume_ml:g} ml")
        if self.min_confidence is not None:
            parts.append(f"confidence >= {self.min_confidence:g}")
        return ", ".join(parts)


def declared_rules(
    *,
    site: Sequence[CriticalRule] = (),
    pipeline: Sequence[CriticalRule] = (),
    models: Mapping[str, Sequence[CriticalRule]] | None = None,
) -> tuple[CriticalRule, ...]:
    """Every rule that applies to one job: the site's, its pipeline's, then each model's
    own (``models``: model name -> its model.yaml rules, scoped to that model here).
    Repeated rules are kept once."""
    scoped = [
        rule.model_copy(update={"model": name}) if rule.model is None else rule
        for name, rules in (models or {}).items()
        for rule in rules
    ]
    return tuple(dict.fromkeys([*site, *pipeline, *scoped]))


def critical_findings(
    rules: Sequence[CriticalRule], findings: Iterable[Finding]
) -> list[tuple[CriticalRule, Finding]]:
    """Each finding that meets a rule, with the first rule it meets (report order)."""
    hits: list[tuple[CriticalRule, Finding]] = []
    for finding in findings:
        rule = next((r for r in rules if r.matches(finding)), None)
        if rule is not None:
            hits.append((rule, finding))
    return hits


__all__ = ["CriticalRule", "critical_findings", "declared_rules"]
