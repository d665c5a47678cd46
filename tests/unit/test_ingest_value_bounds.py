"""The CT scale at both ends, and empty Type 1 attributes, on the DICOM and NIfTI paths.

Content probe of 2026-12-06: a Rescale Intercept of -999,999 or a Rescale Slope of -1e5
made every voxel about -1e6 HU and the job "succeeded", finding nothing (only the top of
the scale was checked for DICOM, both ends for NIfTI); an empty Rescale Intercept was
read as 0 and the stored values ran as HU.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from pydicom.uid import JPEG2000Lossless
from tests.factories.dicom_series import DEFAULT_PATIENT, make_ct_series, make_mr_series

from radserve.errors import StudyError
from radserve.ingest import discover_series, load_nifti, load_series
from radserve.ingest.ct_scale import CT_MAX_HU, CT_MIN_HU
from radserve.ingest.decode import shutdown_decode_workers

SCALE = f"{CT_MIN_HU} to {CT_MAX_HU} HU"


def _edited(folder: Path, paths: list[Path], **values: object) -> Path:
    for path in paths:
        ds = pydicom.dcmread(path)
        for keyword, value in values.items():
            setattr(ds, keyword, value)
        ds.save_as(path, enforce_file_format=True)
    return folder


def _refused(folder: Path) -> StudyError:
    with pytest.raises(StudyError) as info:
        load_series(discover_series(folder)[0])
    return info.value


def _no_patient_data(message: str) -> None:
    # Patient's Sex "O" is one letter: "not in" cannot test it ("SOP Instance UID")
    for value in (v for k, v in DEFAULT_PATIENT.items() if k != "PatientSex"):
        assert value not in message


@pytest.mark.parametrize(
    ("values", "extreme"),
    [
        ({"RescaleIntercept": "-999999"}, "-9999"),  # every voxel near -1e6 HU
        ({"RescaleSlope": "-1e5"}, "-"),  # down to about -1e8 HU
        ({"RescaleSlope": "-1e5", "RescaleIntercept": "-0.5"}, "-"),  # float, not int16
        ({"RescaleIntercept": "999999"}, "1"),  # the top, as before
    ],
)
def test_ct_values_off_the_scale_at_either_end_are_refused(
    tmp_path: Path, values: dict[str, str], extreme: str
) -> None:
    folder = _edited(tmp_path, make_ct_series(tmp_path, n_slices=4), **values)
    error = _refused(folder)
    assert error.code == "implausible_pixel_values"
    assert f"outside the CT scale, {SCALE}" in error.message
    assert error.message.startswith(f"CT values reach {extreme}")
    _no_patient_data(error.message)


def test_ct_values_on_the_scale_still_load(tmp_path: Path) -> None:
    """The extended scale's ends, negative slopes within it: loaded, values exact."""
    hu = np.full((4, 16, 12), -1024.0)
    hu[:, :4] = 30000.0
    make_ct_series(tmp_path / "wide", n_slices=4, hu=hu, rescale=(1.0, -1024.0), bits_stored=16)
    loaded = load_series(discover_series(tmp_path / "wide")[0])
    assert float(loaded.volume.array.min()) == -1024 and float(loaded.volume.array.max()) == 30000
    folder = _edited(tmp_path / "neg", make_ct_series(tmp_path / "neg", n_slices=4))
    stored = pydicom.dcmread(next(folder.iterdir())).pixel_array
    _edited(folder, sorted(folder.iterdir()), RescaleSlope="-1", RescaleIntercept="0")
    loaded = load_series(discover_series(folder)[0])
    assert float(loaded.volume.array.min()) >= -int(stored.max()) - 1  # on the scale


def test_a_streamed_ct_decode_meets_the_same_bound(tmp_path: Path) -> None:
    """A JPEG 2000 stack handed out while it decodes was never checked after its decode:
    one whose header can leave the CT scale is decoded whole and checked."""
    try:
        paths = make_ct_series(
            tmp_path, n_slices=12, rows=40, cols=36, transfer_syntax=JPEG2000Lossless
        )
    except RuntimeError as exc:  # no JPEG 2000 encoder installed here
        pytest.skip(f"cannot encode JPEG 2000 here: {exc}")
    _edited(tmp_path, paths, RescaleIntercept="-999999.5")  # float output, streamable before
    header = discover_series(tmp_path)[0]
    try:
        with pytest.raises(StudyError) as info:
            load_series(header, workers=2, decode_first=lambda shape, spacing: range(shape[0]))
    finally:
        shutdown_decode_workers()
    assert info.value.code == "implausible_pixel_values" and SCALE in info.value.message


def test_a_nifti_ct_meets_the_same_bound_with_the_same_code(tmp_path: Path) -> None:
    data = np.full((16, 16, 4), -1_000_000.0, np.float32)
    nib.save(nib.Nifti1Image(data, np.eye(4)), tmp_path / "low.nii.gz")
    with pytest.raises(StudyError) as info:
        load_nifti(tmp_path / "low.nii.gz", modality="CT")
    assert info.value.code == "implausible_pixel_values"
    assert f"outside the CT scale, {SCALE}" in info.value.message
    assert info.value.message.startswith("NIfTI CT values reach -1000000 HU")
    assert load_nifti(tmp_path / "low.nii.gz", modality="MR").shape == (4, 16, 16)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"RescaleIntercept": ""}, "Rescale Intercept is present but empty"),
        ({"RescaleSlope": "2", "RescaleIntercept": ""}, "Rescale Intercept is present but empty"),
        ({"RescaleSlope": ""}, "Rescale Slope is present but empty"),
        ({"PixelRepresentation": None}, "Pixel Representation is present but empty"),
        ({"BitsStored": None}, "Bits Stored is present but empty"),
        ({"SamplesPerPixel": None}, "Samples per Pixel is present but empty"),
        ({"NumberOfFrames": ""}, "Number of Frames is present but empty"),
    ],
)
def test_an_empty_type1_attribute_is_refused_as_an_absent_one_is(
    tmp_path: Path, values: dict[str, object], named: str
) -> None:
    """Read as absent, a default stood in (intercept 0, slope 1, unsigned, Bits Stored
    of Bits Allocated, one frame): the stored values ran as if they were HU."""
    folder = _edited(tmp_path, make_ct_series(tmp_path, n_slices=4), **values)
    error = _refused(folder)
    assert error.code == "instance_invalid"
    assert named in error.message and "Type 1" in error.message
    _no_patient_data(error.message)


def test_an_empty_rescale_in_an_mr_is_refused_and_an_absent_one_is_not(tmp_path: Path) -> None:
    make_mr_series(tmp_path / "absent", n_slices=4)
    assert load_series(discover_series(tmp_path / "absent")[0]).volume.shape == (4, 16, 12)
    folder = _edited(
        tmp_path / "empty", make_mr_series(tmp_path / "empty", n_slices=4), RescaleSlope=""
    )
    assert _refused(folder).code == "instance_invalid"
