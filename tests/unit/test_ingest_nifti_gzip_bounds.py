"""A ``.nii.gz`` is inflated only within what its header declares, and its declared sizes
meet the ingest bounds before anything past the fixed header is inflated.

Probe (2026-12-06): ``nibabel.load`` inflated every header extension before radserve
looked at a size (a 2.7 MB upload with a 600 MB extension held ~700 MB for 6 s and then
failed as an unreadable file), and a stream that went on past the declared voxels was
read as if it ended there."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from radserve.errors import StudyError
from radserve.ingest import IngestPolicy
from radserve.ingest.nifti import load_nifti

POLICY = IngestPolicy(max_header_bytes=2**20)


def _image(shape: tuple[int, ...] = (64, 48, 12)) -> nib.Nifti1Image:
    data = np.zeros(shape, np.int16)
    data[8:40, 8:40, 2:10] = 40
    return nib.Nifti1Image(data, np.diag([0.8, 0.8, 2.0, 1.0]))


def _gz(path: Path, raw: bytes) -> Path:
    path.write_bytes(gzip.compress(raw, 1))
    return path


def _nifti_bytes(image: nib.Nifti1Image, tmp_path: Path) -> bytes:
    nib.save(image, tmp_path / "plain.nii")
    return (tmp_path / "plain.nii").read_bytes()


def test_a_well_formed_nii_gz_loads_as_before(tmp_path: Path) -> None:
    image = _image()
    path = _gz(tmp_path / "ct.nii.gz", _nifti_bytes(image, tmp_path))
    volume = load_nifti(path, policy=POLICY, modality="CT")
    assert volume.shape == (12, 48, 64)
    assert int(np.count_nonzero(volume.array == 40)) == 32 * 32 * 8


def test_a_stream_that_inflates_beyond_the_declared_voxels_is_refused(tmp_path: Path) -> None:
    raw = _nifti_bytes(_image(), tmp_path) + bytes(8 * 2**20)  # 8 MiB past the voxels
    path = _gz(tmp_path / "ct.nii.gz", raw)
    with pytest.raises(
        StudyError, match=r"gzip stream inflates beyond the .* bytes its header"
    ) as err:
        load_nifti(path, policy=POLICY, modality="CT")
    assert err.value.code == "nifti_invalid"


def test_a_stream_short_of_the_declared_voxels_is_refused(tmp_path: Path) -> None:
    raw = _nifti_bytes(_image(), tmp_path)[:-1000]
    with pytest.raises(StudyError, match=r"ends after .* bytes, short of the") as err:
        load_nifti(_gz(tmp_path / "ct.nii.gz", raw), policy=POLICY, modality="CT")
    assert err.value.code == "nifti_invalid"


def test_extensions_over_max_header_bytes_are_refused_before_they_are_inflated(
    tmp_path: Path,
) -> None:
    image = _image()
    image.header.extensions.append(nib.nifti1.Nifti1Extension(40, bytes(64 * 2**20)))
    nib.save(image, tmp_path / "ct.nii.gz")
    assert (tmp_path / "ct.nii.gz").stat().st_size < 2**20  # 64 MiB of zeros, compressed
    tracemalloc.start()
    try:
        with pytest.raises(StudyError, match=r"declares \d+ bytes before its voxel data") as err:
            load_nifti(tmp_path / "ct.nii.gz", policy=POLICY, modality="CT")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.code == "series_too_large"
    assert peak < 8 * 2**20  # the extension was never inflated (64 MiB)


def test_declared_voxels_over_the_limit_are_refused_before_inflating(tmp_path: Path) -> None:
    path = _gz(tmp_path / "ct.nii.gz", _nifti_bytes(_image(), tmp_path))
    with pytest.raises(StudyError, match=r"NIfTI image of 36864 voxels .*max_voxels=1000") as err:
        load_nifti(path, policy=IngestPolicy(max_voxels=1000), modality="CT")
    assert err.value.code == "series_too_large"


@pytest.mark.parametrize("name", ["gone.nii.gz", "gone.nii"])
def test_a_missing_file_is_a_study_error_not_an_os_error(tmp_path: Path, name: str) -> None:
    """The header look-up opened the file outside the reader's error handling, so a
    missing label map escaped as FileNotFoundError where callers expect the StudyError
    (a comparison run's reuse of an earlier result turned it into 'run them instead')."""
    with pytest.raises(StudyError) as caught:
        load_nifti(tmp_path / name)
    assert caught.value.code == "nifti_invalid"
