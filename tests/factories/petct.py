"""A two-channel PET/CT test model: CT and PET (SUVbw) in, hot lesions out.

One 1x1x1 convolution with fixed weights, so the answer is known: with the CT channel
a step at -500 HU (``ct_window`` centre -500, width 2: 0 in air and lung, 1 in tissue)
and the PET channel the SUV itself, the lesion logit is
``100 * ct + 10 * suv - 100 - 10 * SUV_LEVEL``: a voxel is a lesion where the SUV
exceeds ``SUV_LEVEL`` *and* the tissue is denser than -500 HU (both channels count).
The PET phantom's lesions have SUV 4-12 and its hottest background 3.5 (myocardium).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tests.factories.onnx_models import conv_model

SUV_LEVEL = 3.75
CT_CHANNEL = {
    "name": "ct",
    "modality": "CT",
    "normalisation": {"kind": "ct_window", "center": -500.0, "width": 2.0},
}
PET_CHANNEL = {
    "name": "pet",
    "modality": "PT",
    "units": "SUVbw",
    "normalisation": {"kind": "clip_zscore", "lower": 0.0, "upper": 100.0, "mean": 0.0, "std": 1.0},
}


def petct_logits(ct01: np.ndarray, suv: np.ndarray) -> np.ndarray:
    """numpy twin of the graph: (background, lesion) logits."""
    lesion = 100.0 * ct01 + 10.0 * suv - 100.0 - 10.0 * SUV_LEVEL
    return np.stack([np.zeros_like(lesion), lesion])


def petct_manifest(**input_fields: Any) -> dict[str, Any]:
    lesion = {"value": "52988006", "scheme": "SCT", "meaning": "Lesion"}
    return {
        "name": "petct-test",
        "version": "1.0.0",
        "task": "detection",
        "modality": "CT",
        "input": {
            "mode": "3d",
            "spacing": [4.0, 4.0, 4.0],
            "patch_size": [32, 32, 32],
            "channels": [CT_CHANNEL, PET_CHANNEL],
            **input_fields,
        },
        "labels": [
            {
                "value": 1,
                "name": "hot_lesion",
                "concept": lesion,
                "category": {
                    "value": "49755003",
                    "scheme": "SCT",
                    "meaning": "Morphologically Altered Structure",
                },
                "kind": "lesion",
            }
        ],
    }


def write_petct_bundle(root: Path, **input_fields: Any) -> Path:
    """``root/petct-test/1.0.0`` (model.yaml + model.onnx); returns ``root``."""
    folder = root / "petct-test" / "1.0.0"
    folder.mkdir(parents=True, exist_ok=True)
    w = np.zeros((2, 2, 1, 1, 1), np.float32)
    w[1, 0], w[1, 1] = 100.0, 10.0
    b = np.array([0.0, -100.0 - 10.0 * SUV_LEVEL], np.float32)
    conv_model(folder / "model.onnx", w, b)
    manifest = petct_manifest(**input_fields)
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return root


def _write_pipeline(folder: Path, model: str, modality: str) -> Path:
    """``folder/<model>-pipeline.yaml``: one step of ``model``, its series of ``modality``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{model.removesuffix('-test')}-pipeline.yaml"
    spec = {
        "name": f"{model.removesuffix('-test')}-pipeline",
        "version": "0.0.1",
        "series_selection": {"modalities": [modality]},
        "steps": [{"model": model, "output": "hot_lesions"}],
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def write_petct_pipeline(folder: Path) -> Path:
    return _write_pipeline(folder, "petct-test", "CT")


def pet_only_manifest(spacing: float = 4.0) -> dict[str, Any]:
    """A PET-only model (one channel, PT in SUVbw as its grid): a lesion where the SUV
    exceeds ``SUV_LEVEL``, on the PET's own grid at ``spacing`` mm (the phantom's 4 mm:
    no resampling, so each label is its voxel's SUV against the level)."""
    manifest = petct_manifest(
        spacing=[spacing] * 3, patch_size=[16, 16, 16], channels=[PET_CHANNEL], crop="none"
    )
    return {**manifest, "name": "pet-only-test", "modality": "PT"}


def write_pet_only_bundle(root: Path) -> Path:
    """``root/pet-only-test/1.0.0``: one 1x1x1 convolution, lesion logit
    ``10 * suv - 10 * SUV_LEVEL``; returns ``root``."""
    folder = root / "pet-only-test" / "1.0.0"
    folder.mkdir(parents=True, exist_ok=True)
    w = np.zeros((2, 1, 1, 1, 1), np.float32)
    w[1, 0] = 10.0
    conv_model(folder / "model.onnx", w, np.array([0.0, -10.0 * SUV_LEVEL], np.float32))
    (folder / "model.yaml").write_text(yaml.safe_dump(pet_only_manifest(), sort_keys=False))
    return root


def write_pet_only_pipeline(folder: Path) -> Path:
    return _write_pipeline(folder, "pet-only-test", "PT")


def hand_suv(ds: Any) -> np.ndarray:
    """SUVbw of one PET slice (a pydicom Dataset) by the textbook rule, from its header
    alone: not radserve's converter, so tests can check it against this."""
    item = ds.RadiopharmaceuticalInformationSequence[0]
    injected = dt.datetime.strptime(item.RadiopharmaceuticalStartDateTime[:14], "%Y%m%d%H%M%S")
    start = dt.datetime.strptime(ds.SeriesDate + ds.SeriesTime[:6], "%Y%m%d%H%M%S")
    seconds = (start - injected).total_seconds()
    dose = float(item.RadionuclideTotalDose) * 0.5 ** (seconds / float(item.RadionuclideHalfLife))
    bq_ml = ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    return bq_ml * float(ds.PatientWeight) * 1000.0 / dose


def seg_references(seg: Any) -> set[str]:
    """The SOP Instance UIDs a DICOM SEG says it segments."""
    return {
        ref.ReferencedSOPInstanceUID
        for item in seg.ReferencedSeriesSequence
        for ref in item.ReferencedInstanceSequence
    }
