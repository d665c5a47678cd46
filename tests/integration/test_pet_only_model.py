"""A PET-only model: its one channel, the PET, is the grid and is read in SUVbw.

A single-series model is fed the series' own units (Bq/ml for a PET); nnU-Net PET models
are trained on SUV. Checked against the SUV computed here from each file's header by the
textbook rule (not radserve's converter), voxel by voxel on the PET's own grid, with a
one-channel 1x1x1-convolution model whose lesion is SUV > 3.75 (tests/factories/petct.py).
"""

from __future__ import annotations

import shutil

import numpy as np
import pydicom
import pytest
from tests.factories.petct import (
    SUV_LEVEL,
    hand_suv,
    write_pet_only_bundle,
    write_pet_only_pipeline,
)

from radserve.errors import UnsupportedModalityError
from radserve.ingest.suv import SuvConversionError
from radserve.models.registry import ModelRegistry
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.phantom.pet import generate_pet, write_pet_series
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("petonly")
    phantom = generate_phantom(PhantomSpec.random(0, small=True))
    pet = generate_pet(phantom)
    write_dicom_series(phantom, root / "study")
    paths = write_pet_series(pet, root / "study")
    registry = ModelRegistry([write_pet_only_bundle(root / "models")])
    return pet, paths, root, registry, load_pipeline(write_pet_only_pipeline(root))


def test_a_pet_only_model_labels_each_voxel_by_its_suv(study, tmp_path):
    pet, paths, root, registry, pipeline = study
    result = run_study(
        root / "study", pipeline=pipeline, out_dir=tmp_path, registry=registry, key_images=False
    )
    assert result.report.series_selection.selected.modality == "PT"
    labels = result.volume_result.steps[0].finding_labels
    assert labels.same_geometry(pet.suv), "the labels lie on the PET's own grid"
    suv = np.stack([hand_suv(pydicom.dcmread(p)) for p in paths])
    assert suv.shape == labels.shape
    decided = np.abs(suv - SUV_LEVEL) > 1e-3  # not within float rounding of the level
    expected = suv > SUV_LEVEL
    assert expected.sum() > 50 and (~decided).sum() < 10
    np.testing.assert_array_equal((labels.array > 0)[decided], expected[decided])
    # in the series' own units (Bq/ml, thousands) every voxel with activity would be one
    bq_ml = np.stack([pydicom.dcmread(p).pixel_array.astype(np.float64) for p in paths])
    assert (bq_ml > SUV_LEVEL).sum() > 20 * expected.sum()
    assert len(result.report.findings) >= 2


def test_a_pet_grid_without_patient_weight_is_refused_naming_it(study, tmp_path):
    _pet, paths, _root, registry, pipeline = study
    broken = tmp_path / "study"
    broken.mkdir()
    for path in paths:
        ds = pydicom.dcmread(path)
        del ds.PatientWeight
        ds.save_as(broken / path.name)
    with pytest.raises(SuvConversionError, match=r"Patient Weight \(0010,1030\) is missing"):
        run_study(broken, pipeline=pipeline, out_dir=tmp_path / "o", registry=registry)


def test_a_study_without_a_pet_is_refused_by_the_series_selection(study, tmp_path):
    _pet, _paths, root, registry, pipeline = study
    ct_only = tmp_path / "ct"
    ct_only.mkdir()
    for path in (root / "study").glob("CT*.dcm"):
        shutil.copy(path, ct_only)
    with pytest.raises(
        UnsupportedModalityError, match=r"this pipeline needs PT; the study has \['CT'\]"
    ):
        run_study(ct_only, pipeline=pipeline, out_dir=tmp_path / "o", registry=registry)
