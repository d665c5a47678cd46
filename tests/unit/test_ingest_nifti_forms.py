"""A NIfTI whose two orientations (qform, sform) leave its geometry ambiguous is read as
nibabel reads it, with a warning that says so, or refused where left and right may be
swapped.

Probe (session 37): a header with both codes set and the two affines apart ran on the
sform with no word; a qform-only header with a negative pixdim[1] ran on |pixdim| (nibabel
fixes the sign on load), the writer's mirrored axis silently unmirrored. The files here
are written by nibabel (the negative pixdim patched into its bytes afterwards: nibabel
refuses to write one)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline

from radserve.domain.volume import Volume
from radserve.errors import GeometryError
from radserve.ingest import IngestPolicy, load_nifti, save_nifti
from radserve.models.registry import ModelRegistry
from radserve.pipeline.inputs import NiftiInput
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study
from radserve.progress import StageTimer

SHAPE = (40, 36, 12)  # i, j, k
_PIXDIM_OFFSET = 76  # NIfTI-1: float32 pixdim[8] at byte 76


def _affine(
    degrees: float = 0.0, shift: tuple[float, float, float] = (0, 0, 0), flip_i: bool = False
) -> np.ndarray:
    """An axial RAS affine (0.8 x 0.8 x 2.5 mm), turned ``degrees`` about the slice axis,
    moved by ``shift`` mm, the i axis reversed when ``flip_i``."""
    t = np.radians(degrees)
    turn = np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = turn @ np.diag([-0.8 if flip_i else 0.8, 0.8, 2.5])
    affine[:3, 3] = np.array([-16.0, -14.0, -15.0]) + shift
    return affine


def _data() -> np.ndarray:
    i, j, k = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1], 0 : SHAPE[2]]
    return np.where((i - 20) ** 2 + (j - 18) ** 2 < 150, 40 + i + 2 * j + k, -1000).astype(np.int16)


def _write(path: Path, *, qform: np.ndarray | None, sform: np.ndarray | None) -> Path:
    """A NIfTI-1 written by nibabel with the qform and sform given (None: code 0)."""
    image = nib.Nifti1Image(_data(), None)
    image.set_qform(qform, code=1 if qform is not None else 0)
    image.set_sform(sform, code=1 if sform is not None else 0)
    image.header.set_xyzt_units("mm")
    nib.save(image, str(path))
    return path


def _negate_pixdim(path: Path, index: int) -> None:
    """pixdim[index] made negative in the file's bytes (.nii or .nii.gz)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = bytearray(f.read())
    at = _PIXDIM_OFFSET + 4 * index
    (value,) = struct.unpack("<f", data[at : at + 4])
    data[at : at + 4] = struct.pack("<f", -abs(value))
    with opener(path, "wb") as f:
        f.write(bytes(data))


def _load(path: Path) -> tuple[Volume, list[str]]:
    warnings: list[str] = []
    volume = load_nifti(path, policy=IngestPolicy(), modality="CT", warnings=warnings)
    return volume, warnings


def test_qform_and_sform_that_agree_load_without_a_word(tmp_path: Path) -> None:
    both = _write(tmp_path / "both.nii", qform=_affine(17.0), sform=_affine(17.0))
    volume, warnings = _load(both)
    assert warnings == []
    assert nib.aff2axcodes(volume.nifti_affine()) == ("R", "A", "S")
    # radserve's own writer (qform and sform both, float32 apart) says nothing either
    save_nifti(volume, tmp_path / "again.nii.gz")
    assert _load(tmp_path / "again.nii.gz")[1] == []


def test_qform_and_sform_apart_use_the_sform_with_a_warning_naming_how_far(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path / "apart.nii.gz", qform=_affine(0.0), sform=_affine(3.0, shift=(2.0, 0, 0))
    )
    volume, warnings = _load(path)
    np.testing.assert_allclose(volume.nifti_affine(), nib.load(path).affine, atol=1e-4)
    (said,) = warnings
    assert said.startswith("the NIfTI header's qform and sform (both set) disagree by up to ")
    assert "3.00° in an axis's direction (both RAS); the sform was used" in said
    mm = float(said.split("up to ")[1].split(" mm")[0])
    assert 2.0 < mm < 6.0  # 2 mm moved, and 3° turned at the far corner (~32 mm out)
    # the warning reaches the study's report, as the ingest warnings of a DICOM series do
    ingested = NiftiInput(path).ingest(
        load_pipeline(write_test_pipeline(tmp_path / "p")),
        policy=IngestPolicy(),
        timer=StageTimer(),
    )
    assert said in ingested.loaded.warnings


def test_the_warning_is_in_the_report(tmp_path: Path) -> None:
    path = _write(tmp_path / "apart.nii", qform=_affine(0.0), sform=_affine(0.0, (0, 0, 1.0)))
    result = run_study(
        NiftiInput(path),
        pipeline=load_pipeline(write_test_pipeline(tmp_path)),
        out_dir=tmp_path / "out",
        registry=ModelRegistry(write_test_bundles(tmp_path / "models")),
        key_images=False,
    )
    said = [w for w in result.report.warnings if "qform and sform" in w.message]
    assert [(w.code, w.stage) for w in said] == [("ingest", "ingest")]
    assert "disagree by up to 1.00 mm" in said[0].message


def test_qform_and_sform_with_left_and_right_the_other_way_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "lr.nii", qform=_affine(flip_i=True), sform=_affine())
    with pytest.raises(GeometryError, match=r"qform LAS, sform RAS .*left and right") as info:
        _load(path)
    assert info.value.code == "geometry_invalid"


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
@pytest.mark.parametrize("index", [1, 3])
def test_a_qform_only_header_with_a_negative_pixdim_is_refused(
    tmp_path: Path, suffix: str, index: int
) -> None:
    path = _write(tmp_path / f"q{suffix}", qform=_affine(), sform=None)
    assert _load(path)[1] == []  # as written by nibabel: fine
    _negate_pixdim(path, index)
    with pytest.raises(GeometryError, match=rf"pixdim\[{index}\] is -[\d.]+, negative") as info:
        _load(path)
    assert info.value.code == "geometry_invalid"
    assert "which side is left is unknown" in info.value.message


def test_a_negative_pixdim_beside_an_sform_is_read_from_the_sform(tmp_path: Path) -> None:
    """The sign concerns the qform only; the sform states the orientation."""
    path = _write(tmp_path / "s.nii", qform=None, sform=_affine(10.0))
    _negate_pixdim(path, 1)
    volume, warnings = _load(path)
    assert warnings == []
    np.testing.assert_allclose(volume.nifti_affine(), _affine(10.0), atol=1e-4)


def test_a_file_radserve_wrote_is_read_without_these_checks(tmp_path: Path) -> None:
    """policy None: a report's own label map (radserve writes one orientation)."""
    path = _write(tmp_path / "lr.nii", qform=_affine(flip_i=True), sform=_affine())
    np.testing.assert_allclose(load_nifti(path).nifti_affine(), _affine(), atol=1e-4)
