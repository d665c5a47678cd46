"""Whole studies: a zip upload and a messy folder through discover → load."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import SecondaryCaptureImageStorage
from tests.factories.dicom_series import (
    make_ct_series,
    make_enhanced_series,
    make_mr_series,
    new_uid,
    oblique_orientation,
    ramp_hu,
    series_affine,
    write_not_dicom,
)

from radserve.errors import StudyError
from radserve.ingest import IngestPolicy, discover_series, load_series, load_study
from radserve.pipeline.inputs import ingest_study
from radserve.pipeline.selection import refusals, select_series
from radserve.pipeline.spec import PipelineSpec, SeriesRules


def test_zip_upload_loads_like_the_folder(tmp_path: Path) -> None:
    orientation = oblique_orientation(12.0)
    study = new_uid()
    ct = make_ct_series(tmp_path / "ct", orientation=orientation, order="shuffled", study_uid=study)
    enhanced = make_enhanced_series(tmp_path / "mf", modality="MR", study_uid=study)
    archive = tmp_path / "study.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in [*ct, enhanced]:
            zf.write(path, f"{path.parent.name}/{path.name}")
        zf.writestr("DICOMDIR-notes.txt", "not dicom")

    headers = discover_series(archive)
    assert sorted(h.modality for h in headers) == ["CT", "MR"]
    assert [s.reason for s in headers[0].skipped] == ["not DICOM (no 'DICM' marker)"]
    ct_header = next(h for h in headers if h.modality == "CT")
    from_zip = load_series(ct_header, required_modality="CT", workers=2)
    from_folder = load_series(discover_series(tmp_path / "ct")[0])
    np.testing.assert_array_equal(from_zip.volume.array, from_folder.volume.array)
    np.testing.assert_allclose(from_zip.volume.affine, series_affine(orientation=orientation))
    assert from_zip.source_slices[0].source.member.startswith("ct/")
    mr = load_series(next(h for h in headers if h.modality == "MR"), workers=3)
    np.testing.assert_array_equal(mr.volume.array, ramp_hu(8, 16, 12) + 1000)


def test_load_study_records_every_rejection(tmp_path: Path) -> None:
    study = new_uid()
    make_ct_series(tmp_path / "ct", study_uid=study, series_number=2)
    make_ct_series(tmp_path / "gap", study_uid=study, series_number=3, drop=[2])
    make_mr_series(tmp_path / "mr", n_slices=3, study_uid=study, series_number=4)
    write_not_dicom(tmp_path / "junk" / "thumbs.db")

    result = load_study(tmp_path, required_modality="CT")
    assert [s.header.series_number for s in result.series] == [2]
    assert [(r.header.series_number, r.code) for r in result.rejected] == [
        (3, "geometry_invalid"),
        (4, "unsupported_modality"),
    ]
    assert "missing slices" in result.rejected[0].reason
    assert [s.source.name for s in result.skipped] == ["thumbs.db"]

    lenient = load_study(
        tmp_path,
        policy=IngestPolicy(missing_slices="resample"),
        select=lambda h: h.modality == "CT",
    )
    assert [s.volume.shape for s in lenient.series] == [(8, 16, 12), (8, 16, 12)]
    assert lenient.rejected == ()


def test_each_series_not_selected_is_named_with_its_instance_count(tmp_path: Path) -> None:
    study = new_uid()
    make_ct_series(tmp_path / "study" / "ct", n_slices=5, series_number=1, study_uid=study)
    make_ct_series(tmp_path / "study" / "short", n_slices=2, series_number=2, study_uid=study)
    make_mr_series(tmp_path / "study" / "mr", n_slices=4, series_number=3, study_uid=study)
    rules = SeriesRules(min_slices=3)
    headers = discover_series(tmp_path / "study")
    selected, rejected = select_series(headers, rules)
    assert selected.series_number == 1
    assert sorted((r.series_number, r.instance_count) for r in rejected) == [(2, 2), (3, 4)]
    assert refusals(headers, rules) == []  # the CT qualifies: the study was not refused
    refused = [h for h in headers if h.series_number != 1]
    with pytest.raises(StudyError, match="no series meets"):
        select_series(refused, rules)
    assert sorted(
        (r.series_number, r.instance_count, r.reason) for r in refusals(refused, rules)
    ) == [
        (2, 2, "2 images, fewer than the 3 required"),
        (3, 4, "modality MR is not one of ['CT']"),
    ]


def test_a_secondary_capture_with_modality_ct_is_never_the_series_that_runs(
    tmp_path: Path,
) -> None:
    """A scanner's dose screen and a 3D rendering's screen captures are Secondary Capture
    with Modality CT; under the default ``min_slices: 1`` the 8 captures outnumbered the
    CT's 5 slices and were chosen (then refused at load as colour or without geometry)."""
    study = new_uid()
    make_ct_series(tmp_path / "study" / "ct", n_slices=5, series_number=2, study_uid=study)
    captures = {"dose": (1, 999), "vr": (8, 3)}
    for name, (count, number) in captures.items():
        make_ct_series(tmp_path / "study" / name, n_slices=count, series_number=number,
                       study_uid=study, sop_class_uid=SecondaryCaptureImageStorage,
                       image_type=("ORIGINAL", "PRIMARY", "SCREEN SAVE"))  # fmt: skip
    headers = discover_series(tmp_path / "study")
    selected, rejected = select_series(headers, SeriesRules(prefer="most_slices"))
    assert selected.series_number == 2
    not_volumes = "Secondary Capture Image Storage is not a volume image class"
    assert sorted((r.series_number, r.reason) for r in rejected) == [
        (3, not_volumes),
        (999, not_volumes),
    ]
    captures_only = [h for h in headers if h.series_number != 2]
    with pytest.raises(StudyError, match="not a volume image class"):
        select_series(captures_only, SeriesRules())


def test_an_original_series_wins_a_tie_over_a_derived_one_in_any_order(tmp_path: Path) -> None:
    """Two equally thin series of one size: the ORIGINAL acquisition runs, not the
    DERIVED copy that has the lower Series Number; the input order changes nothing."""
    study = new_uid()
    make_ct_series(tmp_path / "study" / "derived", n_slices=5, series_number=1, study_uid=study,
                   image_type=("DERIVED", "SECONDARY", "AXIAL"))  # fmt: skip
    make_ct_series(tmp_path / "study" / "original", n_slices=5, series_number=2, study_uid=study)
    headers = discover_series(tmp_path / "study")
    for order in (headers, headers[::-1]):
        selected, rejected = select_series(order, SeriesRules())
        assert selected.series_number == 2
        assert [(r.series_number, r.reason) for r in rejected] == [
            (1, "an ORIGINAL series preferred over this DERIVED one")
        ]


def test_a_localizer_or_a_single_image_is_never_a_candidate(tmp_path: Path) -> None:
    """Even a pipeline that excludes no image type never runs on a LOCALIZER series or a
    single slice."""
    study = new_uid()
    make_ct_series(tmp_path / "study" / "scout", n_slices=3, series_number=1, study_uid=study,
                   image_type=("ORIGINAL", "PRIMARY", "LOCALIZER"))  # fmt: skip
    make_ct_series(tmp_path / "study" / "one", n_slices=1, series_number=2, study_uid=study)
    headers = discover_series(tmp_path / "study")
    assert sorted(
        (r.series_number, r.reason) for r in refusals(headers, SeriesRules(exclude_image_types=()))
    ) == [
        (1, "image type ['LOCALIZER'] is excluded"),
        (2, "a single image (a localizer or a capture), not a volume"),
    ]


def test_the_series_description_rule_picks_one_sequence_of_an_mr_study(tmp_path: Path) -> None:
    """A multi-sequence MR model's reference series (the T1 of T1 + T2 + FLAIR) is the one
    whose Series Description matches; the others are named with the rule."""
    study = new_uid()
    for number, description in enumerate(["T2 TSE AX", "T1 SE AX", "T2 FLAIR AX"], start=1):
        make_mr_series(tmp_path / "study" / description, n_slices=4, series_number=number,
                       study_uid=study, series_description=description)  # fmt: skip
    rules = SeriesRules(modalities=("MR",), series_description="(?i)^(?!.*flair).*t1")
    selected, rejected = select_series(discover_series(tmp_path / "study"), rules)
    assert selected.series_description == "T1 SE AX"
    # named by their series (number, UID); the description is never quoted (it may name
    # the patient)
    assert sorted((r.series_number, r.reason) for r in rejected) == [
        (1, "series description does not match '(?i)^(?!.*flair).*t1'"),
        (3, "series description does not match '(?i)^(?!.*flair).*t1'"),
    ]
    with pytest.raises(ValueError, match="series_description is not a regular expression"):
        SeriesRules(series_description="(unclosed")


def _damaged_enhanced(folder: Path, how: str) -> Path:
    path = make_enhanced_series(folder, n_frames=6, study_uid=new_uid())
    ds = pydicom.dcmread(path)
    if how == "frame_item_missing":
        del ds.PerFrameFunctionalGroupsSequence[-1]
    else:  # the last frame's pixel data cut
        ds.PixelData = ds.PixelData[: -ds.Rows * ds.Columns]
    ds.save_as(path, enforce_file_format=True)
    return path


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("frame_item_missing", "5 per-frame functional groups for 6 frames"),
        ("pixel_data_cut", "Pixel Data"),
    ],
)
def test_an_unusable_multi_frame_instance_is_refused_for_what_it_is(
    tmp_path: Path, how: str, said: str
) -> None:
    # session 19: an Enhanced CT with one Per-Frame Functional Groups item too few was
    # refused as "a single image (a localizer or a capture), not a volume": an unusable
    # instance stands as one frame, and the selection judged that count
    _damaged_enhanced(tmp_path, how)
    headers = discover_series(tmp_path)
    (refused,) = refusals(headers, SeriesRules())
    assert refused.reason.startswith("an instance is unusable: ") and said in refused.reason
    with pytest.raises(StudyError, match="an instance is unusable"):
        select_series(headers, SeriesRules())
    # the job fails on the instance, with its own code: what STOW-RS answers it with
    pipeline = PipelineSpec.model_validate(
        {"name": "t", "version": "1.0.0", "steps": [{"model": "organs"}]}
    )
    with pytest.raises(StudyError, match=said) as raised:
        ingest_study(tmp_path, pipeline=pipeline)
    assert raised.value.code in {"instance_invalid", "decode_failed"}


def test_a_series_whose_modality_contradicts_its_sop_class_is_refused_for_that(
    tmp_path: Path,
) -> None:
    """Session 20: a CT Image series with Modality MR failed the CT pipeline's modality
    rule (unsupported_modality) at `radserve run` and C-STORE, while STOW-RS refused each
    instance for the contradiction (instance_invalid): the doors disagreed."""
    for path in make_ct_series(tmp_path, n_slices=4, rows=8, cols=8):
        ds = pydicom.dcmread(path)
        ds.Modality = "MR"
        ds.save_as(path, enforce_file_format=True)
    pipeline = PipelineSpec.model_validate(
        {
            "name": "t",
            "version": "1.0.0",
            "series_selection": {"modalities": ["CT"]},
            "steps": [{"model": "organs"}],
        }
    )
    with pytest.raises(StudyError, match="Modality MR contradicts the SOP Class") as raised:
        ingest_study(tmp_path, pipeline=pipeline)
    assert raised.value.code == "instance_invalid"


def test_slices_each_in_a_series_of_their_own_are_refused_in_a_bounded_message(
    tmp_path: Path,
) -> None:
    """Session 20: a study whose every slice had its own Series Instance UID was refused
    naming "series 1: a single image ..." once per slice (a 500-slice study: 500 times)."""
    for path in make_ct_series(tmp_path, n_slices=40, rows=8, cols=8):
        ds = pydicom.dcmread(path)
        ds.SeriesInstanceUID = pydicom.uid.generate_uid()
        ds.save_as(path, enforce_file_format=True)
    with pytest.raises(StudyError) as raised:
        select_series(discover_series(tmp_path), SeriesRules())
    message = raised.value.message
    assert "not a volume (40 series)" in message and message.count("single image") == 2
    assert "40 series hold a single image each" in message and len(message) < 400


@pytest.mark.parametrize("thickness", ["-4", "0"])
def test_a_slice_thickness_that_is_no_thickness_never_makes_a_series_the_thinnest(
    tmp_path: Path, thickness: str
) -> None:
    """Slice Thickness 0 or negative is read as absent: a 4 mm series claiming -4 mm was
    the thinnest (``prefer: thinnest``, the default) and ran instead of the 2 mm one, and
    a 10 mm one claiming -10 mm passed ``max_slice_thickness_mm`` (round 5, session 21)."""
    study = new_uid()
    make_ct_series(tmp_path / "study" / "thin", n_slices=8, series_number=1, study_uid=study)
    for name, step in (("thick", 4.0), ("slab", 10.0)):
        paths = make_ct_series(tmp_path / "study" / name, n_slices=4, series_number=int(step),
                               spacing=(step, 0.7, 0.9), study_uid=study)  # fmt: skip
        for path in paths:
            ds = pydicom.dcmread(path)
            ds.SliceThickness = thickness if name == "thick" else f"-{step:g}"
            ds.save_as(path, enforce_file_format=True)
    headers = discover_series(tmp_path / "study")
    assert {h.series_number: h.slice_thickness for h in headers} == {1: 2.0, 4: None, 10: None}
    selected, _ = select_series(headers, SeriesRules(max_slice_thickness_mm=5.0))
    assert selected.series_number == 1
    alone = [h for h in headers if h.series_number == 4]
    assert select_series(alone, SeriesRules())[0].series_number == 4  # still usable


def _other_study_copy(paths: list[Path], folder: Path, *, keep_sop_uids: bool) -> None:
    """Each of ``paths`` again in ``folder`` under new Study, Series and Frame of
    Reference UIDs and another Patient ID (its SOP Instance UIDs kept or new)."""
    study, series, frame = new_uid(), new_uid(), new_uid()
    folder.mkdir(parents=True)
    for path in paths:
        ds = pydicom.dcmread(path)
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.PatientID, ds.SeriesNumber = "OTHER-PATIENT", 2
        if not keep_sop_uids:
            ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = new_uid()
        ds.save_as(folder / path.name, enforce_file_format=True)


@pytest.mark.parametrize("keep_sop_uids", [False, True], ids=["own_uids", "sop_uids_kept"])
def test_one_input_holding_two_studies_is_refused_never_one_of_them_run(
    tmp_path: Path, keep_sop_uids: bool
) -> None:
    """An upload or a `radserve run` folder of two patients' studies ran one (the
    thinnest, or the first by Series Number) and named the other patient's series in the
    report as "another series preferred"; when the second kept the first's SOP Instance
    UIDs (an anonymiser), its files were dropped as copies and nothing said it (round 5,
    session 21). C-STORE and STOW-RS give each study its own job before ingest."""
    paths = make_ct_series(tmp_path / "study" / "a", n_slices=5)
    _other_study_copy(paths, tmp_path / "study" / "b", keep_sop_uids=keep_sop_uids)
    with pytest.raises(StudyError, match=r"studies \(Study Instance UIDs differ") as caught:
        select_series(discover_series(tmp_path / "study"), SeriesRules())
    assert caught.value.code == "several_studies"
    assert "OTHER-PATIENT" not in caught.value.message
    for one in ("a", "b"):  # each on its own runs
        (header,) = discover_series(tmp_path / "study" / one)
        assert select_series([header], SeriesRules())[0] is header


def test_a_study_whose_series_name_two_patients_is_refused(tmp_path: Path) -> None:
    """One Study Instance UID holding a misfiled series of another patient ran at every
    door, and its SEG/SR went back into the mixed study under whichever patient the
    selected series named (the thinner series here: patient B's)."""
    study = new_uid()
    make_ct_series(tmp_path / "study" / "a", n_slices=5, study_uid=study, series_number=1)
    b = make_ct_series(
        tmp_path / "study" / "b", n_slices=9, study_uid=study, series_number=2, seed=1
    )
    for path in b:
        ds = pydicom.dcmread(path)
        ds.PatientID, ds.PatientName = "OTHER-PATIENT-55", "Other^Patient"
        ds.save_as(path, enforce_file_format=True)
    pipeline = PipelineSpec.model_validate(
        {"name": "t", "version": "1.0.0", "steps": [{"model": "organs"}]}
    )
    with pytest.raises(StudyError) as caught:
        ingest_study(tmp_path / "study", pipeline=pipeline)
    message = caught.value.message
    assert caught.value.code == "attribute_invalid"
    assert "series 2 and series 1 differ in Patient ID, Patient's Name" in message
    assert "OTHER-PATIENT" not in message and "Other" not in message
    for one in ("a", "b"):  # each series on its own is one patient's study
        assert ingest_study(tmp_path / "study" / one, pipeline=pipeline).loaded.volume.shape[0]


def test_one_sop_instance_uid_in_two_series_of_a_study_is_refused(tmp_path: Path) -> None:
    paths = make_ct_series(tmp_path / "a", n_slices=3)
    ds = pydicom.dcmread(paths[0])
    ds.SeriesInstanceUID = new_uid()
    ds.save_as(tmp_path / "moved.dcm", enforce_file_format=True)
    with pytest.raises(StudyError, match="one SOP Instance UID in two series") as caught:
        discover_series(tmp_path)
    assert caught.value.code == "instance_invalid"
