"""The PET phantom: a PET Image series over the CT phantom with known SUVs.

The truth is checked from the written files with pydicom and arithmetic done here
(not radserve's SUV converter), so the converter's tests can rely on the phantom.
"""

from __future__ import annotations

import shutil

import numpy as np
import pydicom
import pytest
from tests.factories.dciodvfy import dciodvfy_report
from tests.factories.petct import hand_suv

from radserve.ingest import discover_series, load_series
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.phantom.anatomy import Tissue
from radserve.phantom.pet import TISSUE_SUV, generate_pet, write_pet_series

SEED = 0  # small phantom with five lesions (two liver, three lung)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    phantom = generate_phantom(PhantomSpec.random(SEED, small=True))
    pet = generate_pet(phantom)
    out = tmp_path_factory.mktemp("petct")
    write_dicom_series(phantom, out)
    paths = write_pet_series(pet, out)
    return phantom, pet, out, paths


def test_pet_shares_patient_study_and_frame_of_reference_with_the_ct(study):
    _phantom, _pet, out, paths = study
    ct = pydicom.dcmread(out / "CT0000.dcm", stop_before_pixels=True)
    pt = pydicom.dcmread(paths[0], stop_before_pixels=True)
    assert pt.Modality == "PT" and ct.Modality == "CT"
    for keyword in ("StudyInstanceUID", "FrameOfReferenceUID", "PatientID", "PatientName"):
        assert getattr(pt, keyword) == getattr(ct, keyword), keyword
    assert pt.SeriesInstanceUID != ct.SeriesInstanceUID
    assert (pt.Units, pt.DecayCorrection) == ("BQML", "START")
    assert float(pt.PatientWeight) > 0
    slopes = {float(pydicom.dcmread(p, stop_before_pixels=True).RescaleSlope) for p in paths}
    assert len(slopes) > 1, "one Rescale Slope per slice, as scanners write"


def test_written_pet_gives_back_the_known_suv_by_the_hand_rule(study):
    _phantom, pet, _out, paths = study
    suv = np.stack([hand_suv(pydicom.dcmread(p)) for p in paths])
    truth = pet.suv.array
    # 16-bit quantisation per slice: at most half a step of the slice's maximum
    step = truth.max(axis=(1, 2), keepdims=True) / 32767
    assert np.all(np.abs(suv - truth) <= step * 0.51 + 1e-6)
    liver = np.isclose(truth, TISSUE_SUV[Tissue.LIVER])
    assert liver.sum() > 100


def test_every_hot_lesion_has_its_known_suv_at_its_pet_voxels(study):
    phantom, pet, _out, _paths = study
    assert len(pet.lesion_suv) == len(phantom.lesion_list) == 5
    for lesion_id, suv in pet.lesion_suv.items():
        voxels = pet.suv.array[pet.lesions.array == lesion_id]
        assert voxels.size == pet.lesion_voxels[lesion_id] > 0
        np.testing.assert_allclose(voxels, suv, rtol=1e-6)
        assert 4.0 <= suv <= 12.0


def test_lesion_centres_map_to_the_same_patient_point_in_ct_and_pet(study):
    phantom, pet, _out, _paths = study
    for lesion in phantom.lesion_list:
        if pet.lesion_voxels[lesion.lesion_id] < 8:
            continue
        idx = np.rint(pet.suv.patient_to_index(np.array(lesion.centre_mm)))[0].astype(int)
        assert pet.lesions.array[tuple(idx)] == lesion.lesion_id


def test_radserve_ingest_loads_the_pet_on_its_own_grid(study):
    _phantom, pet, out, _paths = study
    series = {h.modality: h for h in discover_series(out)}
    assert set(series) == {"CT", "PT"}
    loaded = load_series(series["PT"])
    assert loaded.volume.same_geometry(pet.suv)
    assert loaded.volume.frame_of_reference_uid == pet.suv.frame_of_reference_uid


@pytest.mark.tools
@pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy not installed")
def test_dciodvfy_reports_no_errors_on_the_pet(study):
    _phantom, _pet, _out, paths = study
    report = dciodvfy_report(paths[5])
    assert "PETImage" in report
    assert not [line for line in report.splitlines() if "Error" in line], report


def test_phantom_command_with_pet_writes_both_series_and_the_suv_truth(tmp_path):
    import json

    from click.testing import CliRunner

    from radserve.cli import cli

    result = CliRunner().invoke(
        cli, ["phantom", "--seed", "5", "--small", "--pet", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    modalities = {h.modality for h in discover_series(tmp_path / "dicom")}
    assert modalities == {"CT", "PT"}
    info = json.loads((tmp_path / "ground_truth" / "pet.json").read_text())
    assert [les["lesion_id"] for les in info["lesions"]] == [1]
    assert (tmp_path / "ground_truth" / "suv.nii.gz").is_file()


def test_radserve_suv_conversion_gives_the_phantoms_known_suvs(study):
    from radserve.ingest.suv import series_to_suv

    _phantom, pet, out, _paths = study
    series = {h.modality: h for h in discover_series(out)}
    suv, factors = series_to_suv(load_series(series["PT"]))
    assert "Units BQML" in factors.rule and "Series Date/Time" in factors.rule
    step = pet.suv.array.max(axis=(1, 2), keepdims=True) / 32767
    assert np.all(np.abs(suv.array - pet.suv.array) <= step * 0.51 + 1e-5)
    for lesion_id, known in pet.lesion_suv.items():
        voxels = suv.array[pet.lesions.array == lesion_id]
        np.testing.assert_allclose(voxels, known, rtol=1e-3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # the second half of the slices decay-corrected to the injection: only the first
        # instance's Decay Correction was read, so they got the START factor (1.4-1.6x)
        (lambda ds, k: k % 2 and setattr(ds, "DecayCorrection", "ADMIN"), "disagree on Decay"),
        # grams written in the kilogram attribute: every SUV 1000 times too high
        (lambda ds, k: setattr(ds, "PatientWeight", str(float(ds.PatientWeight) * 1000)), "kg"),
    ],
    ids=["admin_on_every_other_slice", "weight_in_grams"],
)
def test_radserve_suv_conversion_refuses_headers_no_scanner_means(study, tmp_path, change, message):
    from radserve.ingest.suv import SuvConversionError, series_to_suv

    _phantom, _pet, _out, paths = study
    for k, path in enumerate(paths):
        ds = pydicom.dcmread(path)
        change(ds, k)
        ds.save_as(tmp_path / path.name, enforce_file_format=True)
    (series,) = discover_series(tmp_path)
    with pytest.raises(SuvConversionError, match=message):
        series_to_suv(load_series(series))
