"""Several series in, one model (input.channels): PET/CT through the run path.

The PET/CT phantom (a CT and a PET with known SUV hot lesions in one Frame of
Reference) and a two-channel 1x1x1-convolution model (tests/factories/petct.py) whose
lesion voxels are known: SUV above 3.75 in tissue denser than -500 HU.
"""

from __future__ import annotations

import shutil

import numpy as np
import pydicom
import pytest
from pydantic import ValidationError
from tests.factories.petct import (
    CT_CHANNEL,
    PET_CHANNEL,
    petct_manifest,
    write_petct_bundle,
    write_petct_pipeline,
)

from radserve.errors import StudyError
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.phantom.pet import generate_pet, write_pet_series
from radserve.pipeline.channels import ChannelSeriesError, ChannelSeriesMismatchError
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study
from radserve.preprocess.onto_grid import resample_onto

SEED = 0


@pytest.fixture(scope="module")
def petct(tmp_path_factory):
    root = tmp_path_factory.mktemp("petct")
    phantom = generate_phantom(PhantomSpec.random(SEED, small=True))
    pet = generate_pet(phantom)
    write_dicom_series(phantom, root / "study")
    write_pet_series(pet, root / "study")
    models = write_petct_bundle(root / "models")
    pipeline = load_pipeline(write_petct_pipeline(root))
    return phantom, pet, root, ModelRegistry([models]), pipeline


def test_a_channel_manifest_takes_the_reference_normalisation_and_counts_its_channels():
    spec = ModelSpec.model_validate(petct_manifest())
    assert spec.input.in_channels == 2
    assert spec.input.reference_channel.name == "ct"
    assert spec.input.normalisation.kind == "ct_window"
    assert [c.units for c in spec.input.channels] == ["native", "SUVbw"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": "2d", "patch_size": None}, r"input.channels are for mode '3d'"),
        ({"channels": [CT_CHANNEL, CT_CHANNEL]}, r"names must be unique"),
        ({"channels": [CT_CHANNEL]}, r"declares one channel"),
        ({"reference": "mri"}, r"input.reference 'mri' is not one of \['ct', 'pet'\]"),
        ({"channels": [CT_CHANNEL, {**PET_CHANNEL, "modality": "MR"}]}, r"SUVbw need modality PT"),
        ({"reference": "pet"}, r"modality CT differs from the reference channel 'pet' \(PT\)"),
    ],
)
def test_a_broken_channel_declaration_is_refused_with_the_rule(change, message):
    with pytest.raises(ValidationError, match=message):
        ModelSpec.model_validate(petct_manifest(**change))


def test_the_pet_lands_on_the_ct_grid_at_the_lesions_known_suv(petct):
    phantom, pet, *_ = petct
    on_ct = resample_onto(pet.suv, phantom.ct)
    assert on_ct.same_geometry(phantom.ct)
    checked = 0
    for lesion in phantom.lesion_list:
        if pet.lesion_voxels[lesion.lesion_id] < 20:
            continue  # small lesions blur into their surroundings by interpolation
        idx = np.rint(phantom.ct.patient_to_index(np.array(lesion.centre_mm)))[0].astype(int)
        assert on_ct.array[tuple(idx)] == pytest.approx(pet.lesion_suv[lesion.lesion_id], rel=0.02)
        checked += 1
    assert checked >= 2


def test_a_pet_ct_study_runs_and_its_findings_are_the_hot_lesions(petct, tmp_path):
    phantom, _pet, root, registry, pipeline = petct
    result = run_study(
        root / "study", pipeline=pipeline, out_dir=tmp_path, registry=registry, key_images=False
    )
    assert result.report.series_selection.selected.modality == "CT"
    assert result.report.series_selection.rejected == [], "the PET is used, not passed over"
    labels = result.volume_result.steps[0].finding_labels.array > 0
    lesions = phantom.lesions.array > 0
    # every labelled voxel is within one CT voxel of a hot lesion (no background uptake)
    from scipy.ndimage import binary_dilation

    near = binary_dilation(lesions, iterations=2)
    assert labels.sum() > 50 and (labels & ~near).sum() == 0
    largest = max(phantom.lesion_list, key=lambda les: les.diameter_mm)
    assert np.any(labels & (phantom.lesions.array == largest.lesion_id))
    assert len(result.report.findings) >= 2


def test_without_the_pet_series_the_study_is_refused_naming_the_channel(petct, tmp_path):
    _phantom, _pet, root, registry, pipeline = petct
    ct_only = tmp_path / "ct"
    ct_only.mkdir()
    for path in (root / "study").glob("CT*.dcm"):
        shutil.copy(path, ct_only)
    with pytest.raises(ChannelSeriesError, match=r"channel 'pet' from a PT series.*its series: CT"):
        run_study(ct_only, pipeline=pipeline, out_dir=tmp_path / "o", registry=registry)


def test_a_pet_in_another_frame_of_reference_is_refused(petct, tmp_path):
    _phantom, _pet, root, registry, pipeline = petct
    study = tmp_path / "study"
    shutil.copytree(root / "study", study)
    for path in study.glob("PT*.dcm"):
        ds = pydicom.dcmread(path)
        ds.FrameOfReferenceUID = "1.2.3.4.5.6.7"
        ds.save_as(path)
    with pytest.raises(ChannelSeriesError, match=r"not in the reference series' Frame of Ref"):
        run_study(study, pipeline=pipeline, out_dir=tmp_path / "o", registry=registry)


def test_a_pet_without_patient_weight_is_refused_naming_the_attribute(petct, tmp_path):
    _phantom, _pet, root, registry, pipeline = petct
    study = tmp_path / "study"
    shutil.copytree(root / "study", study)
    for path in study.glob("PT*.dcm"):
        ds = pydicom.dcmread(path)
        del ds.PatientWeight
        ds.save_as(path)
    with pytest.raises(Exception, match=r"Patient Weight \(0010,1030\) is missing"):
        run_study(study, pipeline=pipeline, out_dir=tmp_path / "o", registry=registry)


@pytest.mark.parametrize(
    ("attribute", "value", "named"),
    [
        ("PatientID", "OTHER-PATIENT-7", "Patient ID"),
        ("PatientName", "Other^Patient", "Patient's Name"),
        ("PatientBirthDate", "19010101", "Patient's Birth Date"),
        ("StudyInstanceUID", "1.2.826.0.1.3680043.8.498.77", "Study Instance UID"),
    ],
)
def test_a_pet_of_another_patient_or_study_is_refused_naming_what_differs(
    petct, tmp_path, attribute, value, named
):
    """The PET of another patient or study in the reference's Frame of Reference ran over
    the CT (a folder, or an upload, holding both): now refused, naming the attribute.
    Another patient's PET in the CT's own study makes a study of two patients, refused
    as such before any channel is picked (since session 35)."""
    _phantom, _pet, root, registry, pipeline = petct
    study = tmp_path / "study"
    shutil.copytree(root / "study", study)
    for path in study.glob("PT*.dcm"):
        ds = pydicom.dcmread(path)
        setattr(ds, attribute, value)
        ds.save_as(path)
    with pytest.raises(StudyError) as refused:
        run_study(study, pipeline=pipeline, out_dir=tmp_path / "o", registry=registry)
    message = str(refused.value)
    if attribute == "StudyInstanceUID":
        assert isinstance(refused.value, ChannelSeriesMismatchError)
        assert refused.value.code == "channel_series_mismatch"
        assert f"({named} differ)" in message and "channel 'pet'" in message
    else:
        assert refused.value.code == "attribute_invalid"
        assert "the series of one study name different patients" in message
        assert f"differ in {named})" in message
    assert value not in message  # never the value


def test_the_pet_of_the_reference_study_is_taken_over_another_studys(petct, tmp_path):
    """A folder holding the PET/CT and, beside it, another study's PET in the same Frame
    of Reference, thinner (the one preferred among equals) and without uptake: the
    reference study's PET is read (the other one was, and the lesions were not found)."""
    _phantom, _pet, root, registry, pipeline = petct
    study = tmp_path / "study"
    shutil.copytree(root / "study", study)
    for i, path in enumerate(sorted(study.glob("PT*.dcm"))):
        ds = pydicom.dcmread(path)
        ds.StudyInstanceUID = "1.2.826.0.1.3680043.8.498.78"
        ds.SeriesInstanceUID = "1.2.826.0.1.3680043.8.498.79"
        ds.SOPInstanceUID = f"1.2.826.0.1.3680043.8.498.80.{i + 1}"
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.SliceThickness = float(ds.SliceThickness) / 2
        ds.PixelData = bytes(len(ds.PixelData))
        ds.save_as(path.with_name("other_" + path.name))
    result = run_study(
        study, pipeline=pipeline, out_dir=tmp_path / "o", registry=registry, key_images=False
    )
    assert len(result.report.findings) >= 2
