"""A label value is written into radserve's uint8 label maps, so it runs 1..255: the one
bound (``radserve.models.manifest.MAX_LABEL_VALUE``) the manifest and the nnU-Net and
MONAI importers refuse by, with one reason ("radserve label maps are 8-bit"). Before
2026-12-07 only the importers had it: a hand-written model.yaml with label 256 installed,
and then a sigmoid model labelled every study empty (label 256 read "not found", no
warning) and a softmax model failed each study with numpy's OverflowError (uint8 channel
256). 255 is allowed and labels: a softmax model of 256 channels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from tests.factories.host import CPU_HOST
from tests.factories.onnx_models import conv_model

from radserve.domain.volume import Volume
from radserve.errors import BundleRejectedError
from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import _labels as nnunet_labels
from radserve.inference import ModelSession, SliceTask, choose_runtime, run_task
from radserve.lifecycle.install import install_bundle
from radserve.models.manifest import LABEL_MAPS_8_BIT, MAX_LABEL_VALUE, ModelSpec, load_manifest

HOST = CPU_HOST
CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _label(value: int) -> dict[str, Any]:
    concept = {"value": str(value), "scheme": "99TEST", "meaning": f"s{value}"}
    category = {"value": "2", "scheme": "99TEST", "meaning": "structure"}
    return {"value": value, "name": f"s{value}", "kind": "structure", "concept": concept,
            "category": category}  # fmt: skip


def _manifest(activation: str, values: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "name": f"many-{activation}",
        "version": "1.0.0",
        "task": "segmentation",
        "modality": "CT",
        "activation": activation,
        "input": {
            "mode": "2d",
            "spacing": [None, 1.5, 1.5],
            "normalisation": {"kind": "ct_window", "center": 500.0, "width": 1000.0},
        },
        "labels": [_label(v) for v in values],
        **extra,
    }


def _hot_channel_bundle(folder: Path, activation: str, top: int) -> Path:
    """model.yaml with labels 1..``top`` and a 1x1 conv whose channel of label ``top``
    wins where the input is above 400 HU (0.4 after the window), as the trial's was."""
    channels = top + 1 if activation == "softmax" else top
    hot = top if activation == "softmax" else top - 1
    w = np.zeros((channels, 1, 1, 1), np.float32)
    b = np.full((channels,), -10.0, np.float32)
    w[hot, 0] = 40.0
    b[hot] = -16.0
    if activation == "softmax":
        b[0] = 0.0
    folder.mkdir(parents=True)
    conv_model(folder / "model.onnx", w, b)
    manifest = _manifest(activation, list(range(1, top + 1)))
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return folder


@pytest.mark.parametrize("activation", ["sigmoid", "softmax"])
def test_install_refuses_a_label_above_255_by_name_and_labels_255(tmp_path, activation):
    """The trial's bundles: labels 1..256, channel of label 256 hot. Refused naming the
    label; the same model with labels 1..255 installs and writes 255 where it is hot."""
    bundle = _hot_channel_bundle(tmp_path / "src" / "many" / "1.0.0", activation, 256)
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(bundle, tmp_path / "data", host=HOST)
    message = refused.value.message
    assert "label 's256' has value 256; label values run 1..255" in message
    assert LABEL_MAPS_8_BIT in message and "radserve label maps are 8-bit" in message

    ok = _hot_channel_bundle(tmp_path / "src" / "ok" / "1.0.0", activation, MAX_LABEL_VALUE)
    installed = install_bundle(ok, tmp_path / "data", host=HOST)
    spec = load_manifest(installed.directory / "model.yaml")
    assert spec.num_classes == (256 if activation == "softmax" else 255)
    hu = np.full((2, 24, 24), -1000, np.int16)
    hu[:, 8:16, 8:16] = 800
    volume = Volume.from_geometry(hu, spacing=(2.0, 1.5, 1.5))
    session = ModelSession(installed.directory / "model.onnx", spec, runtime=CPU)
    labels = run_task(SliceTask(volume, spec, crop_to_body=False), session).labels.array
    assert labels.dtype == np.uint8
    assert (labels[:, 8:16, 8:16] == 255).all() and labels.sum() == 255 * 2 * 8 * 8


def test_ignored_values_and_the_importers_refuse_by_the_same_bound_and_reason():
    """ignored_values above 255 said pydantic's "less than or equal to 255"; nnU-Net's
    dataset.json of 257 classes (0..256) is refused with the manifest's reason."""
    with pytest.raises(ValidationError, match=r"ignored_values \[256\] are above 255: radserve"):
        ModelSpec.model_validate(_manifest("softmax", [1, 2], ignored_values=[3, 256]))
    spec = ModelSpec.model_validate(_manifest("softmax", [1], ignored_values=[255]))
    assert spec.num_classes == 256
    labels = {"background": 0, **{f"s{v}": v for v in range(1, MAX_LABEL_VALUE + 2)}}
    with pytest.raises(ImportRefusedError, match=f"256 labels; {LABEL_MAPS_8_BIT}"):
        nnunet_labels({"labels": labels})
    labels.pop(f"s{MAX_LABEL_VALUE + 1}")
    entries, activation, _ = nnunet_labels({"labels": labels})
    assert activation == "softmax" and max(e["value"] for e in entries) == MAX_LABEL_VALUE
