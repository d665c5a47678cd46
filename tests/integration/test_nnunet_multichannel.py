"""Imported nnU-Net models beyond one CT channel vs nnU-Net's own predictor, same weights.

A two-channel CT + PET model (CTNormalization + per-image ZScoreNormalization, as
nnU-Net's planner gives channels named CT and PET), a PET-only model and a one-channel MR
model (ZScoreNormalization with use_mask_for_norm), each a tiny folder built in the test
(tests/factories/nnunet_folder.py, random weights, one fold), imported with the
importer's function; radserve (ONNX Runtime, ``PatchTask``) and ``nnUNetPredictor``
(``predict_single_npy_array``, TTA off) label the same arrays. Needs the ``nnunet`` extra.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="the nnunet extra (torch) is not installed")
pytest.importorskip("nnunetv2", reason="the nnunet extra (nnunetv2) is not installed")

from tests.factories.agreement import agreement, radserve_labels
from tests.factories.nnunet_cases import ct_pet_case, mr_case, pet_case
from tests.factories.nnunet_folder import make_results_folder

from radserve.importers import ImportRefusedError
from radserve.importers.nnunet import import_nnunet
from radserve.models.manifest import load_manifest


@pytest.mark.slow
def test_ct_pet_model_labels_agree_with_nnunet_predictor(tmp_path):
    bundle, ct, pet, theirs, spacing = ct_pet_case(tmp_path)
    spec = load_manifest(bundle / "model.yaml")
    assert [(c.name, c.modality, c.units) for c in spec.input.channels] == [
        ("ct", "CT", "native"),
        ("pet", "PT", "SUVbw"),
    ]
    ours = radserve_labels(bundle, ct, spacing, {"pet": pet})
    assert len(np.unique(theirs)) >= 2
    assert agreement(ours, theirs) >= 0.999, agreement(ours, theirs)
    # The PET channel counts: without its hot sphere the labels change.
    calm = np.where(pet > 5, 1.0, pet).astype(np.float32)
    assert agreement(radserve_labels(bundle, ct, spacing, {"pet": calm}), ours) < 1.0


@pytest.mark.slow
def test_mr_zscore_model_with_the_nonzero_mask_agrees_with_nnunet_predictor(tmp_path):
    bundle, mr, theirs, spacing = mr_case(tmp_path)
    spec = load_manifest(bundle / "model.yaml")
    assert spec.modality == "MR" and spec.input.normalisation.use_mask
    ours = radserve_labels(bundle, mr, spacing)
    assert len(np.unique(theirs)) >= 2
    assert agreement(ours, theirs) >= 0.999, agreement(ours, theirs)


@pytest.mark.slow
def test_pet_only_model_reads_its_pet_in_suv_and_agrees_with_nnunet_predictor(tmp_path):
    """A one-channel PET model (before: refused) declares its channel, so the server
    feeds it SUVbw as nnU-Net PET models are trained (tests/integration/
    test_pet_only_model.py checks that conversion on a PET phantom's files)."""
    bundle, suv, theirs, spacing = pet_case(tmp_path)
    spec = load_manifest(bundle / "model.yaml")
    assert spec.modality == "PT"
    assert [(c.modality, c.units) for c in spec.input.channels] == [("PT", "SUVbw")]
    ours = radserve_labels(bundle, suv, spacing)
    assert len(np.unique(theirs)) >= 2
    assert agreement(ours, theirs) >= 0.999, agreement(ours, theirs)


def test_refusals_name_the_channel_and_the_normalisation(tmp_path):
    """Refused before torch loads anything: the checkpoint is never read."""
    bad_name = make_results_folder(
        tmp_path / "a", folds=(0,), channels=2, channel_names=("CT", "image")
    )
    with pytest.raises(ImportRefusedError, match=r"channel 1 is named 'image'.*--channel 1="):
        import_nnunet(bad_name, tmp_path / "models")
    rgb = make_results_folder(
        tmp_path / "b", folds=(0,), schemes=("RGBTo01Normalization",), channel_names=("CT",)
    )
    with pytest.raises(ImportRefusedError, match=r"normalization 'RGBTo01Normalization'"):
        import_nnunet(rgb, tmp_path / "models")
    assert not (tmp_path / "models").exists()
