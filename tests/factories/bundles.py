"""Tiny model bundles and a pipeline on disk, so the pipeline is tested without the
reference models: an "organ" model that labels every voxel above ``organ_hu`` as
liver, and a "lesion" model that labels voxels above ``lesion_hu`` as a liver lesion
that must lie in the liver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.factories.onnx_models import max_classifier_model, threshold_model

_WINDOW = {"kind": "ct_window", "center": 500.0, "width": 1000.0}  # 0..1000 HU -> 0..1


def _concept(value: str, meaning: str) -> dict[str, str]:
    return {"value": value, "scheme": "SCT", "meaning": meaning}


def _write_bundle(root: Path, manifest: dict[str, Any], level_hu: float) -> Path:
    folder = root / manifest["name"] / manifest["version"]
    folder.mkdir(parents=True, exist_ok=True)
    channels = 2 * manifest["input"].get("context_slices", 0) + 1
    threshold_model(folder / "model.onnx", in_channels=channels, level=level_hu / 1000.0)
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return folder


def write_test_bundles(
    root: Path, *, organ_hu: float = 50.0, lesion_hu: float = 400.0, spacing: float = 1.5
) -> Path:
    """``root/organs-test/1.0.0`` and ``root/lesions-test/1.0.0``; returns ``root``."""
    anatomy = _concept("123037004", "Anatomical Structure")
    _write_bundle(
        root,
        {
            "name": "organs-test",
            "version": "1.0.0",
            "task": "segmentation",
            "modality": "CT",
            "input": {"mode": "2d", "spacing": [None, spacing, spacing], "normalisation": _WINDOW},
            "labels": [
                {
                    "value": 1,
                    "name": "liver",
                    "concept": _concept("10200004", "Liver"),
                    "category": anatomy,
                    "kind": "organ",
                }
            ],
            "postprocess": {"keep_largest": ["liver"]},
        },
        organ_hu,
    )
    _write_bundle(
        root,
        {
            "name": "lesions-test",
            "version": "1.0.0",
            "task": "detection",
            "modality": "CT",
            "input": {
                "mode": "2.5d",
                "context_slices": 1,
                "spacing": [None, spacing, spacing],
                "normalisation": _WINDOW,
                "roi_labels": ["liver"],
            },
            "labels": [
                {
                    "value": 1,
                    "name": "liver_lesion",
                    "concept": _concept("52988006", "Lesion"),
                    "category": _concept("49755003", "Morphologically Altered Structure"),
                    "kind": "lesion",
                    "within": ["liver"],
                }
            ],
        },
        lesion_hu,
    )
    return root


def write_classifier_bundle(
    root: Path, name: str, level_hu: float, *, roi_labels: tuple[str, ...] = ("liver",)
) -> Path:
    """``root/<name>/1.0.0``: a classification model whose one class (label
    ``<name>`` with "-" as "_") is present where a slice's brightest pixel passes
    ``level_hu``: per study the maximum over the slices it reads (on the box of
    ``roi_labels``), reported from probability 0.5. Returns the bundle's folder."""
    folder = root / name / "1.0.0"
    folder.mkdir(parents=True, exist_ok=True)
    max_classifier_model(folder / "model.onnx", level=level_hu / 1000.0)
    label = name.replace("-", "_")
    manifest = {
        "name": name,
        "version": "1.0.0",
        "task": "classification",
        "modality": "CT",
        "input": {
            "mode": "2d",
            "spacing": [None, 1.5, 1.5],
            "normalisation": _WINDOW,
            "roi_labels": list(roi_labels),
        },
        "classification": {"aggregate": "max", "min_probability": 0.5},
        "labels": [
            {
                "value": 1,
                "name": label,
                "kind": "class",
                "concept": _concept("52988006", label),
                "category": _concept("49755003", "Morphologically Altered Structure"),
            }
        ],
    }
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return folder


def write_test_pipeline(folder: Path, *, min_slices: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "test-pipeline.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "test-pipeline",
                "version": "0.0.1",
                "series_selection": {"modalities": ["CT"], "min_slices": min_slices},
                "steps": [
                    {"model": "organs-test", "output": "organs"},
                    {"model": "lesions-test", "output": "findings"},
                ],
            }
        )
    )
    return path


def one_step_pipeline(folder: Path, model: str) -> Path:
    """``folder/one-step.yaml``: a CT pipeline of the one step running ``model`` (its
    output named organs), the smallest pipeline ``radserve models build-variants
    --pipeline`` gates a model through."""
    path = folder / "one-step.yaml"
    spec = {
        "name": "one-step",
        "version": "1",
        "series_selection": {"modalities": ["CT"], "min_slices": 3},
        "steps": [{"model": model, "output": "organs"}],
    }
    path.write_text(yaml.safe_dump(spec))
    return path
