"""Every class a model's output can produce is a label or declared ``ignored_values``.

Before 2026-12-06 a softmax model declaring labels 1 and 3 (no 2) installed, and the
voxels class 2 won were reported as nothing: liver and spleen came back "not found", with
no warning, a false negative a radiologist would read. Install and import now refuse such
a bundle naming the undeclared values; a bundle that has one anyway (installed before,
or placed in a models folder by hand) carries a warning in its step's result. The same
holds for sigmoid outputs with more channels than labels and for classifiers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tests.factories.bundles import write_classifier_bundle, write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.onnx_models import conv_model

from radserve.domain import Volume
from radserve.errors import BundleRejectedError
from radserve.lifecycle.graph_checks import check_onnx
from radserve.lifecycle.install import install_bundle
from radserve.models.manifest import load_manifest
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, run_volume
from radserve.pipeline.spec import PipelineSpec

HOST = CPU_HOST
ORGAN_HU = 120


def _organ_bundle(
    root: Path, labels: list[int], *, channels: int, winner: int, **extra: Any
) -> Path:
    """organs-test 1.0.0 (2d, one CT channel) with ``labels`` (liver, spleen, ...) and a
    1x1 conv of ``channels`` outputs whose channel ``winner`` wins above 50 HU."""
    write_test_bundles(root)
    folder = root / "organs-test" / "1.0.0"
    weight = np.zeros((channels, 1, 1, 1), np.float32)
    weight[winner] = 40.0
    bias = np.zeros(channels, np.float32)
    bias[winner] = -2.0  # the window maps 0..1000 HU to 0..1: logit 0 at 50 HU
    conv_model(folder / "model.onnx", weight, bias)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    names = ["liver", "spleen", "kidney", "pancreas"]
    manifest["labels"] = [
        {**manifest["labels"][0], "value": value, "name": names[i]}
        for i, value in enumerate(labels)
    ]
    manifest["postprocess"] = []
    manifest.update(extra)
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return folder


def _refusal(folder: Path, tmp_path: Path) -> str:
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(folder, tmp_path / "data", host=HOST)
    return refused.value.message


def test_a_softmax_model_with_a_gap_in_its_label_values_is_refused_naming_it(tmp_path):
    folder = _organ_bundle(tmp_path / "src", [1, 3], channels=4, winner=2)
    message = _refusal(folder, tmp_path)
    assert "output class values [2] are declared neither as labels nor in ignored_values" in (
        message
    )
    assert "labels [1, 3]" in message


def test_the_gap_declared_as_ignored_installs(tmp_path):
    folder = _organ_bundle(tmp_path / "src", [1, 3], channels=4, winner=2, ignored_values=[2])
    assert install_bundle(folder, tmp_path / "data", host=HOST).version == "1.0.0"


def test_an_ignored_class_above_the_labels_counts_in_the_output_channels(tmp_path):
    """A model of 5 classes reporting 1..3: class 4 ignored makes the 5 channels right."""
    folder = _organ_bundle(tmp_path / "src", [1, 2, 3], channels=5, winner=1)
    assert "has 5 channels; the manifest implies 4 output classes" in _refusal(folder, tmp_path)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml.safe_dump({**manifest, "ignored_values": [4]}))
    assert check_onnx(load_manifest(folder / "model.yaml"), folder) == []


def test_a_sigmoid_model_with_more_channels_than_labels_is_refused_naming_the_channel(tmp_path):
    folder = _organ_bundle(tmp_path / "src", [1, 3], channels=3, winner=1, activation="sigmoid")
    message = _refusal(folder, tmp_path)
    assert "output class values [2] are declared neither" in message
    assert "3 output channels, channel c class c + 1" in message


def test_a_classifier_with_an_undeclared_class_is_refused(tmp_path):
    folder = write_classifier_bundle(tmp_path / "src", "bleed", 300.0, roi_labels=())
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["labels"][0]["value"] = 2  # softmax: channel 1 is now no declared class
    manifest["input"].pop("roi_labels")
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    reasons = check_onnx(load_manifest(folder / "model.yaml"), folder)
    assert any("output class values [1] are declared neither" in r for r in reasons), reasons
    assert any("class scores won by them" in r for r in reasons), reasons


def test_an_ignored_value_that_is_also_a_label_is_refused(tmp_path):
    folder = _organ_bundle(tmp_path / "src", [1, 3], channels=4, winner=2, ignored_values=[3])
    with pytest.raises(Exception, match=r"ignored_values \[3\] are label values too"):
        load_manifest(folder / "model.yaml")


def _run(root: Path) -> Any:
    ct = np.full((12, 40, 40), -1000, np.int16)
    ct[2:10, 10:30, 10:30] = ORGAN_HU
    pipeline = PipelineSpec.model_validate(
        {"name": "p", "version": "1", "steps": [{"model": "organs-test"}]}
    )
    return run_volume(
        Volume.from_geometry(ct, spacing=(1.0, 1.0, 2.0)),
        pipeline,
        registry=ModelRegistry([root]),
        sessions=SessionPool(),
    )


def test_voxels_won_by_an_undeclared_class_at_run_time_are_warned_about(tmp_path):
    """An older bundle with the gap (placed by hand: nothing installs it now): the organ
    voxels go to class 2; the step's result says so instead of a silent 'not found'."""
    _organ_bundle(tmp_path / "models", [1, 3], channels=4, winner=2)
    result = _run(tmp_path / "models")
    (step,) = result.steps
    assert [(m.label, m.coverage) for m in step.organs] == [
        ("liver", "not_found"),
        ("spleen", "not_found"),
    ]
    assert len(step.warnings) == 1, step.warnings
    assert "labelled voxels with class values 2 (5.2 ml)" in step.warnings[0]
    assert "may read as not found" in step.warnings[0]


def test_voxels_of_an_ignored_class_are_not_warned_about(tmp_path):
    _organ_bundle(tmp_path / "models", [1, 3], channels=4, winner=2, ignored_values=[2])
    (step,) = _run(tmp_path / "models").steps
    assert step.warnings == []


def test_a_classifier_s_undeclared_class_outscoring_its_labels_is_warned_about(tmp_path):
    """A softmax classifier declaring value 2 only (placed by hand): class 1 winning the
    study is said, not reported as the declared label's low score."""
    from radserve.pipeline.undeclared import undeclared_class_warning

    folder = write_classifier_bundle(tmp_path, "bleed", 300.0, roi_labels=())
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest["labels"][0]["value"] = 2
    manifest["input"].pop("roi_labels")
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))
    spec = load_manifest(folder / "model.yaml")
    warning = undeclared_class_warning(spec, {1: 0.7, 2: 0.2})
    assert warning is not None and "undeclared class values 1 (p 0.700)" in warning
    assert "best declared label: p 0.200" in warning
    assert undeclared_class_warning(spec, {1: 0.1, 2: 0.8}) is None
