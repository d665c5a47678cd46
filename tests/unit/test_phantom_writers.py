"""Phantom writers: DICOM, NIfTI and JSON round trips, and the CLI command."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pydicom
import pytest
from click.testing import CliRunner

from radserve.commands.phantom import command
from radserve.domain.volume import Volume
from radserve.phantom import (
    ORGAN_LABELS,
    PhantomSpec,
    generate_phantom,
    write_dicom_series,
    write_ground_truth,
    write_nifti,
)


@pytest.fixture(scope="module")
def phantom():
    spec = PhantomSpec.random(2, small=True).with_slices(n_slices=10)
    return generate_phantom(spec)


@pytest.mark.parametrize("syntax", ["explicit", "jpeg2000", "rle"])
def test_dicom_round_trip(phantom, tmp_path, syntax):
    paths = write_dicom_series(
        phantom, tmp_path, transfer_syntax=syntax, patient_name="Müller^Jürgen", priority="stat"
    )
    assert len(paths) == phantom.spec.n_slices
    assert paths == sorted(paths)
    ct = phantom.ct
    for k, path in enumerate(paths):
        ds = pydicom.dcmread(path)
        hu = ds.pixel_array.astype(np.int32) * int(ds.RescaleSlope) + int(ds.RescaleIntercept)
        assert np.array_equal(hu, ct.array[k])
        np.testing.assert_allclose(
            [float(v) for v in ds.ImagePositionPatient],
            ct.affine[:3, :3] @ [k, 0, 0] + ct.affine[:3, 3],
            atol=1e-4,
        )
        assert ds.SOPInstanceUID == ct.source_sop_instance_uids[k]
        assert ds.InstanceNumber == k + 1
    ds = pydicom.dcmread(paths[0])
    assert ds.file_meta.TransferSyntaxUID.is_compressed == (syntax != "explicit")
    assert [float(v) for v in ds.PixelSpacing] == pytest.approx([ct.spacing[1], ct.spacing[2]])
    assert [float(v) for v in ds.ImageOrientationPatient] == [1, 0, 0, 0, 1, 0]
    assert float(ds.SpacingBetweenSlices) == pytest.approx(ct.spacing[0])
    assert float(ds.SliceThickness) == pytest.approx(phantom.spec.slice_thickness_mm)
    assert ds.FrameOfReferenceUID == ct.frame_of_reference_uid
    assert str(ds.PatientName) == "Müller^Jürgen"
    assert ds.SpecificCharacterSet == "ISO_IR 192"
    assert ds.RequestedProcedurePriority == "STAT"
    assert ds.RequestAttributesSequence[0].RequestedProcedurePriority == "STAT"
    assert ds.Modality == "CT" and ds.Manufacturer == "radserve phantom"


def test_dicom_uids_deterministic_and_study_specific(phantom, tmp_path):
    a = pydicom.dcmread(write_dicom_series(phantom, tmp_path / "a")[3])
    b = pydicom.dcmread(write_dicom_series(phantom, tmp_path / "b")[3])
    c = pydicom.dcmread(write_dicom_series(phantom, tmp_path / "c", study_uid="1.2.3.4")[3])
    assert a.StudyInstanceUID == b.StudyInstanceUID and a.SOPInstanceUID == b.SOPInstanceUID
    assert c.StudyInstanceUID == "1.2.3.4"
    assert c.SOPInstanceUID != a.SOPInstanceUID and c.SeriesInstanceUID != a.SeriesInstanceUID


def test_dicom_rejects_unknown_options(phantom, tmp_path):
    with pytest.raises(ValueError, match="transfer_syntax"):
        write_dicom_series(phantom, tmp_path, transfer_syntax="jpegls")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="priority"):
        write_dicom_series(phantom, tmp_path, priority="urgent-ish")


def test_dicom_of_a_slice_subset_keeps_geometry(tmp_path):
    spec = PhantomSpec.random(3, small=True)
    sub = generate_phantom(spec, range(6, 9))
    paths = write_dicom_series(sub, tmp_path)
    assert [p.name for p in paths] == ["CT0006.dcm", "CT0007.dcm", "CT0008.dcm"]
    ds = pydicom.dcmread(paths[-1])
    z = spec.first_slice_z_mm + 8 * spec.slice_spacing_mm
    assert float(ds.ImagePositionPatient[2]) == pytest.approx(z, abs=1e-4)
    assert ds.InstanceNumber == 9


def test_nifti_round_trip(phantom, tmp_path):
    for vol in (phantom.ct, phantom.organs, phantom.lesions):
        path = write_nifti(vol, tmp_path / "v.nii.gz")
        img = nib.load(path)
        back = Volume.from_nifti_arrays(np.asanyarray(img.dataobj), img.affine)
        assert back.array.dtype == vol.array.dtype
        assert np.array_equal(back.array, vol.array)
        np.testing.assert_allclose(back.affine, vol.affine, atol=1e-5)


def test_ground_truth_files(phantom, tmp_path):
    paths = write_ground_truth(phantom, tmp_path)
    truth = json.loads(paths["json"].read_text())
    assert truth["seed"] == phantom.spec.seed
    assert truth["organ_labels"] == ORGAN_LABELS
    assert len(truth["lesions"]) == len(phantom.lesion_list)
    labels = np.asanyarray(nib.load(paths["labels"]).dataobj)
    assert np.array_equal(np.transpose(labels, (2, 1, 0)), phantom.organs.array)


def test_cli_writes_study(tmp_path):
    out = tmp_path / "study"
    args = ["--seed", "4", "--out", str(out), "--small", "--slices", "6", "--nifti"]
    args += ["--priority", "stat", "--patient-name", "Doe^Jane", "--transfer-syntax", "rle"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out)
    files = sorted((out / "dicom").glob("*.dcm"))
    assert len(files) == 6
    ds = pydicom.dcmread(files[0])
    assert str(ds.PatientName) == "Doe^Jane" and ds.RequestedProcedurePriority == "STAT"
    assert (out / "ct.nii.gz").exists()
    assert (out / "ground_truth" / "lesions.json").exists()


def test_jpeg2000_full_size_parallel_write(tmp_path):
    # openjpeg's encoder crashed when called from several threads on 512x512 frames
    sub = generate_phantom(PhantomSpec.random(7), range(100, 108))
    paths = write_dicom_series(sub, tmp_path, transfer_syntax="jpeg2000", workers=4)
    ds = pydicom.dcmread(paths[5])
    assert np.array_equal(ds.pixel_array.astype(np.int32) - 1024, sub.ct.array[5])
