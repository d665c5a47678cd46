"""NIfTI label maps land on the input: affine and voxels survive a nibabel round trip."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from tests.factories.findings import oblique_affine

from radserve.domain import Volume
from radserve.errors import ReportError
from radserve.report import read_nifti, write_label_map


@pytest.mark.parametrize("affine", [np.diag([2.5, 0.7, 0.9, 1.0]), oblique_affine((3.0, 0.8, 0.6))])
def test_label_map_round_trip(tmp_path: Path, affine: np.ndarray) -> None:
    labels = np.zeros((5, 6, 7), np.int64)
    labels[1, 2, 3], labels[4, 5, 6] = 1, 7
    volume = Volume(labels, affine)
    path = write_label_map(volume, tmp_path / "labels.nii.gz")
    image = nib.load(path)
    assert image.get_data_dtype() == np.uint8
    assert np.allclose(image.affine, volume.nifti_affine(), atol=1e-5)
    assert np.array_equal(np.asanyarray(image.dataobj), labels.transpose(2, 1, 0))
    back = read_nifti(path)
    assert back.same_geometry(volume, tol=1e-5)
    assert np.array_equal(back.array, labels)
    # voxel (slice, row, column) and NIfTI (i, j, k) point at the same patient position
    ras = image.affine @ np.array([6, 5, 4, 1.0])
    lps = volume.index_to_patient(np.array([4, 5, 6]))[0]
    assert np.allclose(ras[:3] * [-1, -1, 1], lps, atol=1e-4)


def test_many_findings_use_uint16_and_bad_labels_are_refused(tmp_path: Path) -> None:
    labels = np.zeros((2, 2, 2), np.int32)
    labels[0, 0, 0] = 300
    path = write_label_map(Volume(labels, np.eye(4)), tmp_path / "l.nii")
    assert nib.load(path).get_data_dtype() == np.uint16
    with pytest.raises(ReportError, match="must hold integers"):
        write_label_map(Volume(labels.astype(float), np.eye(4)), tmp_path / "f.nii")
    with pytest.raises(ReportError, match=r"0\.\.65535"):
        write_label_map(Volume(labels - 400, np.eye(4)), tmp_path / "n.nii")


class _TornArray(np.ndarray):
    """A label array whose bytes fail while nibabel writes them out (after the header):
    what a full disk does midway through a map."""

    def tobytes(self, order: str = "C") -> bytes:  # type: ignore[override]
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("name", ["labels.nii.gz", "labels.nii"])
def test_a_label_map_is_complete_or_absent(tmp_path: Path, name: str) -> None:
    """A write that fails midway leaves nothing under the map's name nor a temporary;
    the same map written again is whole and reads back with nibabel."""
    labels = np.zeros((40, 64, 64), np.uint8)
    labels[10:30, 5:60, 5:60] = 2
    good = tmp_path / name
    good.write_bytes(b"an older map")  # a previous result stays until the new one is whole

    with pytest.raises(ReportError, match="No space left"):
        write_label_map(Volume(labels.view(_TornArray), np.eye(4)), good)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert good.read_bytes() == b"an older map"
    write_label_map(Volume(labels, np.eye(4)), good)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert np.array_equal(np.asanyarray(nib.load(good).dataobj), labels.transpose(2, 1, 0))
