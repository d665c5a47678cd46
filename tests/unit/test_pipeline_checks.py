"""A pipeline YAML is checked against the installed models when it is loaded: each rule
it breaks is refused with a message naming the rule, before any study is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories.bundles import write_test_bundles

from radserve.errors import ModelError, PipelineError, UnknownModelError
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.pipeline.checks import check_pipeline
from radserve.pipeline.spec import PipelineSpec, load_pipeline


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    return ModelRegistry(write_test_bundles(tmp_path_factory.mktemp("models")))


def _pipeline(*steps: dict[str, Any], **fields: Any) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": "p", "version": "1", "steps": list(steps), **fields}
    )


def test_the_test_pipeline_passes_and_resolves_each_step(registry) -> None:
    spec = _pipeline({"model": "organs-test"}, {"model": "lesions-test"})
    assert [b.spec.key for b in check_pipeline(spec, registry)] == [
        "organs-test/1.0.0",
        "lesions-test/1.0.0",
    ]


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        (
            [{"model": "organs-test"}, {"model": "organs-test"}],
            r"rule 'unique step names': steps 1 and 2 both have step name 'organs-test'",
        ),
        (
            [
                {"model": "organs-test", "name": "a"},
                {"model": "organs-test", "name": "b", "output": "a"},
            ],
            r"rule 'unique outputs': steps 1 and 2 both have output 'a'",
        ),
    ],
)
def test_duplicate_step_names_and_outputs_are_refused_at_parse(steps, match) -> None:
    with pytest.raises(ValueError, match=match):
        _pipeline(*steps)


def test_a_duplicate_output_in_a_yaml_file_names_the_file_and_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "p", "version": "1",
        "steps": [{"model": "a", "output": "x"}, {"model": "b", "output": "x"}],
    }))  # fmt: skip
    with pytest.raises(PipelineError, match=r"(?s)p\.yaml.*rule 'unique outputs'"):
        load_pipeline(path)


def test_an_unknown_model_is_refused_with_did_you_mean(registry) -> None:
    with pytest.raises(
        UnknownModelError,
        match=r"rule 'installed models'.*step 1 \('organ-test'\).*did you mean 'organs-test'",
    ):
        check_pipeline(_pipeline({"model": "organ-test"}), registry)


def test_an_roi_no_earlier_step_produces_is_refused(registry) -> None:
    """lesions-test restricts itself to 'liver': without the organ step first, refused."""
    with pytest.raises(
        PipelineError,
        match=r"rule 'upstream labels'.*input\.roi_labels names 'liver', which no earlier "
        r"step produces",
    ):
        check_pipeline(_pipeline({"model": "lesions-test"}), registry)


def test_a_reference_two_earlier_steps_produce_is_refused_as_ambiguous(registry) -> None:
    spec = _pipeline(
        {"model": "organs-test", "name": "a"},
        {"model": "organs-test", "name": "b"},
        {"model": "lesions-test"},
    )
    with pytest.raises(PipelineError, match=r"names 'liver', which steps \['a', 'b'\] all produce"):
        check_pipeline(spec, registry)


def test_a_model_for_another_modality_is_refused(registry) -> None:
    spec = _pipeline({"model": "organs-test"}, series_selection={"modalities": ["MR"]})
    with pytest.raises(PipelineError, match=r"rule 'modality'.*reads CT.*\['MR'\]"):
        check_pipeline(spec, registry)


def _manifest(task: str, kind: str | None) -> dict[str, Any]:
    label: dict[str, Any] = {
        "value": 1, "name": "x",
        "concept": {"value": "1", "scheme": "SCT", "meaning": "x"},
        "category": {"value": "2", "scheme": "SCT", "meaning": "y"},
    }  # fmt: skip
    if kind is not None:
        label["kind"] = kind
    return {
        "name": "m", "version": "1", "task": task, "modality": "CT",
        "input": {"mode": "2d", "spacing": [None, 1, 1],
                  "normalisation": {"kind": "ct_window", "center": 0, "width": 1}},
        "labels": [label],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("task", "kind", "expected"),
    [
        ("segmentation", None, "organ"),
        ("detection", None, "lesion"),
        ("segmentation", "structure", "structure"),
        ("detection", "finding", "finding"),
    ],
)
def test_task_gives_the_default_label_kind(task, kind, expected) -> None:
    assert ModelSpec.model_validate(_manifest(task, kind)).labels[0].kind == expected


@pytest.mark.parametrize("kind", ["organ", "structure"])
def test_a_detection_model_cannot_declare_region_labels(kind) -> None:
    with pytest.raises(ValueError, match=r"task 'detection' declares findings only"):
        ModelSpec.model_validate(_manifest("detection", kind))


def test_an_unknown_label_kind_is_a_model_error(tmp_path: Path) -> None:
    from radserve.models.manifest import load_manifest

    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(_manifest("segmentation", "vertebra")))
    with pytest.raises(
        ModelError, match=r"(?s)kind.*'organ', 'structure', 'lesion', 'finding' or 'class'"
    ):
        load_manifest(path)


@pytest.mark.parametrize(
    ("rule", "match"),
    [
        (
            {"label": "liver"},  # an organ: never a finding, so never pushed
            r"rule 'critical labels': pipeline 'p' critical\[0\] names label 'liver', which "
            r"no step produces as a finding label.*produce: \['liver_lesion'\]",
        ),
        ({"label": "liver_lesoin"}, r"names label 'liver_lesoin'"),
        (
            {"label": "liver_lesion", "model": "organs-test"},
            r"names label 'liver_lesion', which no step produces",
        ),
        ({"label": "liver_lesion", "model": "nope"}, r"names model 'nope', which no step runs"),
    ],
)
def test_a_critical_rule_no_step_can_meet_is_refused(registry, rule, match) -> None:
    spec = _pipeline({"model": "organs-test"}, {"model": "lesions-test"}, critical=[rule])
    with pytest.raises(PipelineError, match=match):
        check_pipeline(spec, registry)


def test_a_critical_rule_on_a_steps_finding_label_passes(registry) -> None:
    rule = {"label": "liver_lesion", "model": "lesions-test", "min_long_axis_mm": 10}
    spec = _pipeline({"model": "organs-test"}, {"model": "lesions-test"}, critical=[rule])
    assert len(check_pipeline(spec, registry)) == 2
