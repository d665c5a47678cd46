"""A study's input as the pipeline takes it: the next series when the preferred one
cannot be loaded, NIfTI under the DICOM path's selection and geometry rules, and the
report's header reads of files ingest took (content probe, 2026-12-06)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset
from tests.factories.dicom_series import DEFAULT_PATIENT, make_ct_series, new_uid, truncate

from radserve.domain import Volume
from radserve.errors import ReportError, StudyError
from radserve.ingest import IngestPolicy, load_nifti
from radserve.pipeline.inputs import NiftiInput, ingest_study
from radserve.pipeline.spec import PipelineSpec
from radserve.progress import StageTimer
from radserve.report import render_overview
from radserve.report.dicom.common import read_headers


def _pipeline(**rules: object) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "t",
            "version": "1.0.0",
            "series_selection": {"modalities": ["CT"], **rules},
            "steps": [{"model": "organs"}],
        }
    )


# --- 5. the next series when the preferred one cannot be loaded ------------------------------
def _edit(paths: list[Path], **values: object) -> None:
    for path in paths:
        ds = pydicom.dcmread(path)
        for keyword, value in values.items():
            setattr(ds, keyword, value)
        ds.save_as(path, enforce_file_format=True)


def _good_and_thinner(folder: Path, damage: str) -> None:
    """An intact 2 mm series (number 2) and a 1 mm one (number 3) the selection prefers
    (thinnest), damaged as ``damage`` says."""
    study = new_uid()
    make_ct_series(folder / "good", n_slices=8, series_number=2, study_uid=study)
    thin = make_ct_series(
        folder / "thin",
        n_slices=10,
        series_number=3,
        study_uid=study,
        spacing=(1.0, 0.7, 0.9),
        drop=[5] if damage == "gap" else (),
    )
    if damage == "truncated":
        for path in thin:
            truncate(path, 0.8)
    elif damage == "nan_slope":
        _edit(thin, RescaleSlope="NaN")
    elif damage == "empty_intercept":
        _edit(thin, RescaleIntercept="")


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        ("gap", "geometry_invalid"),
        ("truncated", "decode_failed"),
        ("nan_slope", "instance_invalid"),
        ("empty_intercept", "instance_invalid"),
    ],
)
def test_a_preferred_series_that_cannot_be_loaded_gives_way_to_the_next(
    tmp_path: Path, damage: str, code: str
) -> None:
    """Before, the job failed with the thinner series' error and the intact series
    beside it was never tried."""
    _good_and_thinner(tmp_path, damage)
    ingested = ingest_study(tmp_path, pipeline=_pipeline())
    assert ingested.loaded.header.series_number == 2
    assert ingested.loaded.volume.shape == (8, 16, 12)
    (skipped,) = [r for r in ingested.rejected if r.series_number == 3]
    assert skipped.reason == f"preferred, but could not be loaded ({code})"
    (warning,) = [w for w in ingested.loaded.warnings if "was skipped" in w]
    assert warning.startswith("series 3 (") and f"[{code}]" in warning
    assert "series 2 (8 images) was analysed instead" in warning
    assert str(tmp_path) not in warning and ".dcm" not in warning  # instances, not files
    # Patient's Sex "O" is one letter: "not in" cannot test it ("SOP Instance UID")
    for value in (v for k, v in DEFAULT_PATIENT.items() if k != "PatientSex"):
        assert value not in warning


def test_when_no_series_loads_the_preferred_series_error_is_raised(tmp_path: Path) -> None:
    _good_and_thinner(tmp_path, "gap")
    _edit(sorted((tmp_path / "good").iterdir()), RescaleSlope="NaN")
    with pytest.raises(StudyError) as info:
        ingest_study(tmp_path, pipeline=_pipeline())
    assert info.value.code == "geometry_invalid" and "missing slices" in info.value.message


def test_a_limit_reached_stops_the_study_without_trying_another_series(tmp_path: Path) -> None:
    """A limit is no fault of one series: the next one is not loaded (the same cost)."""
    _good_and_thinner(tmp_path, "none")
    with pytest.raises(StudyError) as info:
        ingest_study(tmp_path, pipeline=_pipeline(), policy=IngestPolicy(max_voxels=1500))
    assert info.value.code == "series_too_large" and "10 × 16 × 12" in info.value.message


def test_an_intact_preferred_series_is_used_and_the_others_named_as_before(
    tmp_path: Path,
) -> None:
    _good_and_thinner(tmp_path, "none")
    ingested = ingest_study(tmp_path, pipeline=_pipeline())
    assert ingested.loaded.header.series_number == 3
    assert [(r.series_number, r.reason) for r in ingested.rejected] == [
        (2, "another series preferred (thinnest)")
    ]
    assert not [w for w in ingested.loaded.warnings if "was skipped" in w]


# --- 3. NIfTI under the series-selection rules; an empty one refused -------------------------
def _nifti(path: Path, data: np.ndarray, affine: np.ndarray | None = None, **codes: int) -> Path:
    image = nib.Nifti1Image(data, np.diag([0.8, 0.8, 2.0, 1.0]) if affine is None else affine)
    if codes:
        image.set_sform(image.affine, code=codes.get("sform", 0))
        image.set_qform(image.affine, code=codes.get("qform", 0))
    nib.save(image, path)
    return path


def _ingest_nifti(path: Path, pipeline: PipelineSpec, **policy: object) -> Volume:
    ingested = NiftiInput(path).ingest(
        pipeline, policy=IngestPolicy(**policy) if policy else None, timer=StageTimer()
    )
    return ingested.loaded.volume


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        ((32, 32), "a single image (a localizer or a capture), not a volume"),  # 2-D
        ((32, 32, 1), "a single image (a localizer or a capture), not a volume"),
        ((32, 32, 5), "5 images, fewer than the 20 required"),
    ],
)
def test_a_nifti_meets_the_slice_count_a_dicom_series_meets(
    tmp_path: Path, shape: tuple[int, ...], said: str
) -> None:
    """A 2-D, 1-slice or 5-slice NIfTI ran and reported "no findings" where a DICOM
    series of as few slices was refused ``study_invalid``."""
    path = _nifti(tmp_path / "few.nii.gz", np.full(shape, -1000, np.int16))
    with pytest.raises(StudyError) as info:
        _ingest_nifti(path, _pipeline(min_slices=20))
    assert info.value.code == "study_invalid"
    assert "does not meet the pipeline's selection rules" in info.value.message
    assert said in info.value.message
    enough = _nifti(tmp_path / "enough.nii.gz", np.full((32, 32, 20), -1000, np.int16))
    assert _ingest_nifti(enough, _pipeline(min_slices=20)).shape == (20, 32, 32)


def test_a_nifti_meets_the_slice_thickness_limit(tmp_path: Path) -> None:
    path = _nifti(tmp_path / "thick.nii.gz", np.full((32, 32, 20), -1000, np.int16),
                  np.diag([0.8, 0.8, 8.0, 1.0]))  # fmt: skip
    with pytest.raises(StudyError, match="slice thickness 8 mm exceeds 5 mm"):
        _ingest_nifti(path, _pipeline(max_slice_thickness_mm=5.0))


def test_a_nifti_of_no_slices_is_refused_at_ingest(tmp_path: Path) -> None:
    """dim[3] = 0 failed internal_error (an IndexError drawing the overview)."""
    path = _nifti(tmp_path / "empty.nii.gz", np.zeros((32, 32, 0), np.int16))
    with pytest.raises(StudyError) as info:
        load_nifti(path, policy=IngestPolicy(), modality="CT")
    assert info.value.code == "nifti_invalid" and "holds no voxels" in info.value.message
    with pytest.raises(StudyError, match="holds no voxels"):
        _ingest_nifti(path, _pipeline())


def test_an_overview_of_a_volume_without_slices_is_a_report_error() -> None:
    with pytest.raises(ReportError, match="no overview image"):
        render_overview(Volume(np.zeros((0, 16, 16), np.int16), np.eye(4)))


# --- 6. NIfTI geometry as a DICOM stack's ---------------------------------------------------
def test_a_nifti_without_orientation_is_refused(tmp_path: Path) -> None:
    """qform_code = sform_code = 0: nibabel's fallback affine stood in, and the
    findings named a side nothing in the file stated."""
    data = np.full((32, 32, 20), -1000, np.int16)
    path = _nifti(tmp_path / "none.nii.gz", data, qform=0, sform=0)
    with pytest.raises(StudyError) as info:
        _ingest_nifti(path, _pipeline())
    assert info.value.code == "geometry_invalid" and "declares no orientation" in info.value.message
    for codes in ({"qform": 1}, {"sform": 1}, {"sform": 2}):
        ok = _nifti(tmp_path / f"ok{len(codes)}{sorted(codes.items())}.nii.gz", data, **codes)
        assert _ingest_nifti(ok, _pipeline()).shape == (20, 32, 32)


def _sheared(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """20 slices 2 mm apart, each 1 mm further along x (RAS) than the one below it; a
    bright voxel at (i, j, k) = (10, 12, 15)."""
    data = np.full((32, 32, 20), -1000, np.int16)
    data[10, 12, 15] = 500
    affine = np.diag([0.8, 0.8, 2.0, 1.0])
    affine[0, 2] = 1.0
    return _nifti(tmp_path / "sheared.nii.gz", data, affine, sform=1), affine


def test_a_sheared_nifti_meets_the_gantry_tilt_setting(tmp_path: Path) -> None:
    """A sheared affine was accepted while a DICOM stack so sheared is refused by
    default (``ingest.gantry_tilt: reject``); ``flag`` keeps it, ``correct`` shifts the
    slices onto an orthogonal grid, the voxel staying where it is in the patient."""
    path, affine = _sheared(tmp_path)
    with pytest.raises(StudyError) as info:
        _ingest_nifti(path, _pipeline())
    assert info.value.code == "geometry_invalid"
    assert "the slice axis (k) is 26.57° from the normal" in info.value.message
    assert "gantry_tilt" in info.value.message
    bright_ras = (affine @ [10, 12, 15, 1])[:3]
    for choice in ("flag", "correct"):
        ingested = NiftiInput(path).ingest(
            _pipeline(), policy=IngestPolicy(gantry_tilt=choice), timer=StageTimer()
        )
        volume = ingested.loaded.volume
        (warning,) = ingested.loaded.warnings
        assert warning.startswith("sheared NIfTI affine")
        k, row, col = np.unravel_index(int(np.argmax(volume.array)), volume.shape)
        lps = volume.index_to_patient(np.array([[k, row, col]], float))[0]
        np.testing.assert_allclose(lps * [-1, -1, 1], bright_ras, atol=0.8)
        if choice == "correct":
            step = volume.affine[:3, 0]
            assert (
                abs(step @ volume.affine[:3, 1]) < 1e-6 and abs(step @ volume.affine[:3, 2]) < 1e-6
            )


def test_a_nifti_with_sheared_in_plane_axes_is_refused_whatever_the_setting(
    tmp_path: Path,
) -> None:
    affine = np.diag([0.8, 0.8, 2.0, 1.0])
    affine[0, 1] = 0.3  # j leans towards i
    path = _nifti(tmp_path / "plane.nii.gz", np.full((32, 32, 20), -1000, np.int16), affine,
                  sform=1)  # fmt: skip
    for choice in ("reject", "flag", "correct"):
        with pytest.raises(StudyError, match="in-plane axes") as info:
            _ingest_nifti(path, _pipeline(), gantry_tilt=choice)
        assert info.value.code == "geometry_invalid"


# --- 4. the report reads the files ingest took ----------------------------------------------
def _bare(paths: list[Path], folder: Path, *, implicit: bool, keep_meta: bool) -> list[Path]:
    """Each file again without its preamble (and, unless ``keep_meta``, its File Meta)."""
    folder.mkdir()
    out = []
    for path in paths:
        ds = pydicom.dcmread(path)
        target = folder / path.stem
        if keep_meta:
            ds.preamble = None
            ds.save_as(target, enforce_file_format=False)
            data = target.read_bytes()
            if data[128:132] == b"DICM":
                target.write_bytes(data[132:])
        else:
            buffer = DicomBytesIO()
            buffer.is_little_endian, buffer.is_implicit_VR = True, implicit
            ds.file_meta = pydicom.dataset.FileMetaDataset()
            write_dataset(buffer, ds)
            target.write_bytes(buffer.getvalue())
        out.append(target)
    return out


@pytest.mark.parametrize(
    ("implicit", "keep_meta"), [(True, False), (False, False), (False, True)]
)  # fmt: skip
def test_the_report_reads_source_files_without_file_meta_as_ingest_did(
    tmp_path: Path, implicit: bool, keep_meta: bool
) -> None:
    """``radserve run`` on such files ran the models, then failed report_failed
    "cannot read the DICOM header of source file 1 of N (UnreadableHeaderError)"."""
    paths = make_ct_series(tmp_path / "src", n_slices=4)
    bare = _bare(paths, tmp_path / "bare", implicit=implicit, keep_meta=keep_meta)
    ingested = ingest_study(tmp_path / "bare", pipeline=_pipeline())
    files = [s.source.path for s in ingested.loaded.source_slices]
    headers = read_headers(files)
    assert [str(h.SOPInstanceUID) for h in headers] == list(
        ingested.loaded.volume.source_sop_instance_uids
    )
    assert sorted(files) == sorted(bare)
    (tmp_path / "text").write_bytes(b"not DICOM at all")
    with pytest.raises(ReportError, match="source file 1 of 1"):
        read_headers([tmp_path / "text"])
