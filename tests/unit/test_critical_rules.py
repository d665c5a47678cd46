"""Critical-finding rules declared by a model (model.yaml), a pipeline and the site: each
validated where it is written, and merged as a union in which no source can remove or
relax another's rule (a model's own rules only ever meet that model's findings)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from radserve.domain.critical import CriticalRule, critical_findings, declared_rules
from radserve.domain.findings import CodedConcept, Finding
from radserve.models.manifest import ModelSpec

_CONCEPT = {"value": "1", "scheme": "SCT", "meaning": "x"}


def _model(**fields: Any) -> dict[str, Any]:
    label = {"value": 1, "name": "bleed", "concept": _CONCEPT, "category": _CONCEPT}
    organ = {**label, "value": 2, "name": "brain", "kind": "organ"}
    return {
        "name": "ich", "version": "1", "task": "segmentation", "modality": "CT",
        "input": {"mode": "2d", "spacing": [None, 1, 1],
                  "normalisation": {"kind": "ct_window", "center": 0, "width": 1}},
        "labels": [{**label, "kind": "finding"}, organ], **fields,
    }  # fmt: skip


def _finding(number: int, label: str, model: str, axis_mm: float) -> Finding:
    concept = CodedConcept(value="1", scheme="SCT", meaning="x")
    return Finding.model_validate({
        "finding_id": number, "label": label, "label_value": 1, "concept": concept,
        "volume_ml": 1.0, "longest_diameter_mm": axis_mm, "short_axis_mm": 1.0,
        "centroid_mm": (0, 0, 0), "centroid_voxel": (0, 0, 0), "key_slice_index": 0,
        "confidence": 0.9, "model": model, "model_version": "1",
    })  # fmt: skip


def test_a_model_declares_its_critical_findings_in_model_yaml() -> None:
    spec = ModelSpec.model_validate(_model(critical=[{"label": "bleed", "min_volume_ml": 5}]))
    assert spec.critical == (CriticalRule(label="bleed", min_volume_ml=5),)


@pytest.mark.parametrize(
    ("critical", "match"),
    [
        (
            [{"label": "brain"}],
            r"rule 'critical labels': critical\[0\] names label 'brain', which is not a "
            r"finding label \(kind lesion/finding\) of this model; its finding labels: \['bleed'\]",
        ),
        ([{"label": "bled"}], r"critical\[0\] names label 'bled'"),
        ([{"label": "bleed", "model": "other"}], r"critical\[0\] names model 'other'"),
        ([{"label": "bleed", "min_long_axis_mm": 0}], r"greater than 0"),
        ([{"label": "bleed", "size_mm": 3}], r"size_mm\s+Extra inputs are not permitted"),
    ],
)
def test_a_model_yaml_critical_rule_is_validated(critical, match) -> None:
    with pytest.raises(ValidationError, match=match):
        ModelSpec.model_validate(_model(critical=critical))


def test_rules_combine_as_a_union_and_a_models_rules_meet_only_its_findings() -> None:
    site = [CriticalRule(label="bleed", min_long_axis_mm=30)]
    pipeline = [CriticalRule(label="liver_lesion", min_long_axis_mm=20)]
    model = {"ich": (CriticalRule(label="bleed"),)}  # any bleed of the ich model
    rules = declared_rules(site=site, pipeline=pipeline, models=model)
    assert [r.describe() for r in rules] == [
        "label bleed, long axis >= 30 mm",
        "label liver_lesion, long axis >= 20 mm",
        "label bleed, model ich",
    ]
    findings = [
        _finding(1, "bleed", "ich", 3),  # the model's own rule: critical at any size
        _finding(2, "bleed", "other", 3),  # another model's bleed: only the site's 30 mm
        _finding(3, "bleed", "other", 31),
        _finding(4, "liver_lesion", "lesions", 19),
        _finding(5, "liver_lesion", "lesions", 21),
    ]
    hits = [(r.describe(), f.finding_id) for r, f in critical_findings(rules, findings)]
    assert hits == [
        ("label bleed, model ich", 1),
        ("label bleed, long axis >= 30 mm", 3),
        ("label liver_lesion, long axis >= 20 mm", 5),
    ]
    # a site rule that repeats a declared one adds nothing; a stricter one removes nothing
    again = declared_rules(site=[*site, CriticalRule(label="bleed", model="ich")], models=model)
    assert len(again) == 2
    assert critical_findings(again, findings[:1])
