"""A lesion model has no organ labels of its own, but its accuracy depends on the contrast
phase as much as the organ model's: it declares the mean HU of the organ step's structures
(``input_domain.structure_hu`` naming upstream labels), is judged on the organ step's
measurements and flagged in its own name, and a pipeline whose earlier steps do not
produce those structures is refused when it is loaded."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from tests.factories.bundles import write_test_bundles

from radserve.domain import Volume
from radserve.domain.input_domain import INPUT_DOMAIN_UNCHECKED, OUTSIDE_INPUT_DOMAIN
from radserve.errors import PipelineError
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, run_volume
from radserve.pipeline.checks import check_pipeline
from radserve.pipeline.profile import check_output_domain
from radserve.pipeline.spec import PipelineSpec

LIVER_HU = 120.0  # the test organ model's liver: every voxel above 50 HU


def _lesion_model(root: Path, name: str, domain: dict[str, Any], *, roi: bool = True) -> None:
    """lesions-test under another name, with ``domain`` as its input domain."""
    shutil.copytree(root / "lesions-test", root / name)
    path = root / name / "1.0.0" / "model.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest["name"] = name
    manifest["input_domain"] = domain
    if not roi:  # a model that needs nothing upstream but its input domain's structures
        manifest["input"].pop("roi_labels")
        for label in manifest["labels"]:
            label.pop("within", None)
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    root = write_test_bundles(tmp_path_factory.mktemp("models"))
    _lesion_model(root, "lesions-venous", {"structure_hu": {"liver": {"min": 150.0}}})
    _lesion_model(root, "lesions-any", {"structure_hu": {"liver": {"min": 0.0}}})
    _lesion_model(root, "lesions-spleen", {"structure_hu": {"spleen": {"min": 90.0}}})
    _lesion_model(
        root, "lesions-alone", {"structure_volumes_ml": {"liver": {"min": 1.0}}}, roi=False
    )
    return ModelRegistry([root])


def _pipeline(*models: str) -> PipelineSpec:
    steps = [{"model": m} for m in models]
    return PipelineSpec.model_validate({"name": "p", "version": "1", "steps": steps})


def _ct(*, liver: bool = True) -> Volume:
    """Air, around a 120 HU block the organ model calls liver (``liver``)."""
    array = np.full((12, 40, 40), -1000, np.int16)
    if liver:
        array[2:10, 10:30, 10:30] = LIVER_HU
    return Volume.from_geometry(array, spacing=(1.0, 1.0, 2.0))  # axial, as the models read


def _flags(registry: ModelRegistry, *models: str, liver: bool = True) -> list[tuple[str, str]]:
    result = run_volume(
        _ct(liver=liver), _pipeline(*models), registry=registry, sessions=SessionPool()
    )
    return check_output_domain(result)


def test_the_lesion_model_is_flagged_in_its_own_name_by_the_organ_steps_structure(registry):
    flags = _flags(registry, "organs-test", "lesions-venous")
    assert len(flags) == 1, flags
    code, message = flags[0]
    assert code == OUTSIDE_INPUT_DOMAIN
    assert message.startswith(
        "outside the input domain of lesions-venous/1.0.0 (structures of organs-test/1.0.0): "
        "liver reads 120 HU on average, outside the expected [150, inf] HU"
    ), message
    # inside its range: nothing said
    assert _flags(registry, "organs-test", "lesions-any") == []


def test_a_declared_structure_the_organ_step_did_not_find_is_noted_unchecked(registry):
    """organs-test has no spleen label: refused at load (below); a liver with no voxel
    above 50 HU (not found) leaves the phase unchecked instead."""
    # a volume outside a range needs a structure
    assert _flags(registry, "organs-test", "lesions-alone", liver=False) == []
    assert _flags(registry, "organs-test", "lesions-any", liver=False) == [
        (
            INPUT_DOMAIN_UNCHECKED,
            "input domain of lesions-any/1.0.0 not wholly checked: liver not found: the "
            "mean HU that shows the contrast phase not checked",
        )
    ]


@pytest.mark.parametrize(
    ("models", "match"),
    [
        (
            ("lesions-alone",),
            r"rule 'upstream labels'.*model lesions-alone/1\.0\.0 "
            r"input_domain\.structure_volumes_ml names 'liver', which no earlier step produces",
        ),
        (
            ("organs-test", "lesions-spleen"),
            r"input_domain\.structure_hu names 'spleen', which no earlier step produces.*"
            r"earlier steps produce: \['liver'\]",
        ),
    ],
)
def test_structures_no_earlier_step_produces_are_refused_at_load(registry, models, match):
    with pytest.raises(PipelineError, match=match):
        check_pipeline(_pipeline(*models), registry)


def test_structures_an_earlier_step_produces_load(registry):
    bundles = check_pipeline(_pipeline("organs-test", "lesions-alone"), registry)
    assert [b.spec.key for b in bundles] == ["organs-test/1.0.0", "lesions-alone/1.0.0"]


def test_an_organ_model_still_names_its_own_labels(registry):
    """A model with region labels is judged on its own map: a name it does not segment is
    a typo, refused with the model file."""
    manifest = registry.get("organs-test").spec.model_dump(mode="json", exclude_none=True)
    manifest["input_domain"] = {"structure_hu": {"aorta": {"min": 150.0}}}
    with pytest.raises(ValidationError, match=r"names 'aorta', which is not a region label"):
        ModelSpec.model_validate(manifest)
