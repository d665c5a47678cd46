"""The reference models' processing as declared ops gives what the older model.yaml keys
gave, and ops a model author adds run through the real pipeline with no Python.

The shipped organs/lesions bundles declare op lists; the same bundles with their
``postprocess`` written back as the older mapping (``threshold``, ``min_component_ml``,
``keep_largest``, ``min_confidence``, derived here from the shipped ops) must give the
same label maps, organ measurements and findings on a phantom study, both run in this
test through the reference pipeline.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from scipy import ndimage

from radserve.models.registry import ModelRegistry, bundled_model_dir
from radserve.pipeline import SessionPool, VolumeResult, load_pipeline, run_volume

PIPELINE = "ct-chest-abdomen"
_LEGACY_KEY = {"threshold": "threshold", "min_size": "min_component_ml",
               "keep_largest": "keep_largest", "min_confidence": "min_confidence"}  # fmt: skip


def _legacy(ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The older ``postprocess`` mapping that meant ``ops`` (label-wide rules only)."""
    section: dict[str, Any] = {}
    for op in ops:
        assert op["op"] in _LEGACY_KEY and (op["op"] == "keep_largest" or not op.get("labels"))
        value = {k: v for k, v in op.items() if k != "op"}
        section[_LEGACY_KEY[op["op"]]] = value["labels"] if op["op"] == "keep_largest" else (
            next(iter(value.values()))
        )  # fmt: skip
    return section


def _copy_bundles(root: Path, edit) -> Path:
    """The pipeline's bundles copied under ``root`` with ``edit(manifest)`` applied."""
    registry = ModelRegistry([bundled_model_dir()])
    for step in load_pipeline(PIPELINE).steps:
        source = registry.get(step.model, step.version).directory
        target = root / step.model / source.name
        shutil.copytree(source, target)
        manifest = yaml.safe_load((target / "model.yaml").read_text())
        (target / "model.yaml").write_text(yaml.safe_dump(edit(manifest)))
    return root


def _run(ct, models: Path | None) -> VolumeResult:
    registry = ModelRegistry([models] if models else [bundled_model_dir()])
    return run_volume(ct, load_pipeline(PIPELINE), registry=registry, sessions=SessionPool())


@pytest.fixture(scope="module")
def phantom():
    from radserve.phantom import PhantomSpec, generate_phantom

    return generate_phantom(PhantomSpec.random(5, small=True))


def test_shipped_op_lists_give_the_same_results_as_the_older_keys(phantom, tmp_path) -> None:
    def legacy(manifest: dict[str, Any]) -> dict[str, Any]:
        assert isinstance(manifest["postprocess"], list)  # shipped as ops
        return {**manifest, "postprocess": _legacy(manifest["postprocess"])}

    shipped = _run(phantom.ct, None)
    older = _run(phantom.ct, _copy_bundles(tmp_path / "legacy", legacy))
    assert [s.name for s in shipped.steps] == [s.name for s in older.steps] == ["organs", "lesions"]
    for new, old in zip(shipped.steps, older.steps, strict=True):
        np.testing.assert_array_equal(new.labels.array, old.labels.array)
        assert new.organs == old.organs
        assert new.findings == old.findings
        if new.finding_labels is not None:
            np.testing.assert_array_equal(new.finding_labels.array, old.finding_labels.array)
    assert shipped.findings, "the phantom has findings to compare"
    assert any(m.volume_ml for m in shipped.organ_measurements)


def test_ops_a_model_author_adds_run_through_the_pipeline(phantom, tmp_path) -> None:
    def more(manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["task"] == "segmentation":
            manifest["preprocess"] = [{"op": "median", "size": 3}]
            manifest["postprocess"] += [
                {"op": "closing", "radius_mm": 2.0, "labels": ["liver"]},
                {"op": "fill_holes", "labels": ["liver"]},
            ]
        else:
            manifest["postprocess"] += [{"op": "nms", "iou": 0.01}]
        return manifest

    result = _run(phantom.ct, _copy_bundles(tmp_path / "more", more))
    organs, lesions = result.steps
    liver = organs.labels.array == organs.bundle.spec.label("liver").value
    assert liver.any() and np.array_equal(ndimage.binary_fill_holes(liver), liver)
    found = ndimage.find_objects(lesions.finding_labels.array)
    boxes = [found[f.label_value - 1] for f in lesions.findings]
    assert len(boxes) >= 2, "findings to compare"
    for i, a in enumerate(boxes):  # no two kept findings' boxes overlap by more than 1 %
        for b in boxes[i + 1 :]:
            inter = np.prod([max(0, min(p.stop, q.stop) - max(p.start, q.start))
                             for p, q in zip(a, b, strict=True)])  # fmt: skip
            union = np.prod([s.stop - s.start for s in a]) + np.prod(
                [s.stop - s.start for s in b]
            ) - inter  # fmt: skip
            assert inter / union <= 0.01
