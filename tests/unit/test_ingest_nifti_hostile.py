"""NIfTI files that are not what their header says, refused naming what is wrong (the
2026-12-07 probe of a running ``radserve serve``, docs/hostile-input.md "Frames, tables
and bombs"): an infinite scl_slope ran on the stored values (nibabel reads it as "no
scaling"); a NaN scl_inter beside a usable slope, a truncated ``.nii``, a ``.nii.gz``
cut short or followed by bytes that are not gzip failed as "not a readable NIfTI file
(HeaderDataError)" or "voxel data could not be read (OSError / EOFError /
BadGzipFile)"."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from radserve.errors import StudyError
from radserve.ingest import IngestPolicy
from radserve.ingest.nifti import load_nifti

POLICY = IngestPolicy()
_SCALING = 112  # scl_slope, scl_inter: two float32 at this offset of a NIfTI-1 header


def _nii(tmp_path: Path, scaling: tuple[float, float] | None = None) -> bytes:
    data = np.zeros((40, 36, 12), np.int16)
    data[8:30, 8:30, 2:10] = 40
    nib.save(nib.Nifti1Image(data, np.diag([0.8, 0.8, 2.0, 1.0])), tmp_path / "made.nii")
    raw = bytearray((tmp_path / "made.nii").read_bytes())
    if scaling is not None:
        raw[_SCALING : _SCALING + 8] = struct.pack("<2f", *scaling)
    return bytes(raw)


def _load(path: Path) -> StudyError:
    with pytest.raises(StudyError) as info:
        load_nifti(path, policy=POLICY, modality="CT")
    assert info.value.code == "nifti_invalid", info.value
    return info.value


@pytest.mark.parametrize("scaling", [(np.inf, 0.0), (-np.inf, 0.0), (2.0, np.nan), (2.0, np.inf)])
def test_a_scaling_that_cannot_be_applied_is_refused(
    tmp_path: Path, scaling: tuple[float, float]
) -> None:
    path = tmp_path / "ct.nii"
    path.write_bytes(_nii(tmp_path, scaling))
    assert "the NIfTI header's scaling is not usable: scl_slope" in _load(path).message


@pytest.mark.parametrize("scaling", [(0.0, 0.0), (np.nan, np.nan), (np.nan, 5.0), (1.0, 0.0)])
def test_the_scalings_that_mean_none_read_the_stored_values(
    tmp_path: Path, scaling: tuple[float, float]
) -> None:
    """0 (the NIfTI standard's "no scaling") and NaN (nibabel's, on every float image it
    writes) are read as unscaled, as before."""
    path = tmp_path / "ct.nii"
    path.write_bytes(_nii(tmp_path, scaling))
    volume = load_nifti(path, policy=POLICY, modality="CT")
    assert int(np.count_nonzero(volume.array == 40)) == 22 * 22 * 8


def test_a_truncated_nii_is_named_so(tmp_path: Path) -> None:
    raw = _nii(tmp_path)
    path = tmp_path / "ct.nii"
    path.write_bytes(raw[: len(raw) * 2 // 3])
    message = _load(path).message
    assert f"the NIfTI file holds {len(raw) * 2 // 3} bytes, short of the {len(raw)}" in message
    assert message.endswith("a truncated file")


def test_a_nii_gz_cut_short_is_named_so(tmp_path: Path) -> None:
    packed = gzip.compress(_nii(tmp_path))
    path = tmp_path / "ct.nii.gz"
    path.write_bytes(packed[: len(packed) - 12])  # the end of the deflate stream, and more
    assert "a truncated file" in _load(path).message


def test_a_nii_gz_followed_by_bytes_that_are_not_gzip_is_named_so(tmp_path: Path) -> None:
    path = tmp_path / "ct.nii.gz"
    path.write_bytes(gzip.compress(_nii(tmp_path)) + b"trailing garbage" * 10)
    assert "gzip stream is followed by bytes that are not gzip" in _load(path).message


def test_a_nii_gz_padded_with_zeros_loads(tmp_path: Path) -> None:
    """gzip allows zeros after a stream (a tape's padding): read as before."""
    path = tmp_path / "ct.nii.gz"
    path.write_bytes(gzip.compress(_nii(tmp_path)) + bytes(4096))
    assert load_nifti(path, policy=POLICY, modality="CT").shape == (12, 36, 40)
