"""DICOM SEG writer: write -> read back -> compare with the JSON report and the label maps.

A tiny study (a 'liver' block with two 'lesions') runs through the whole pipeline with
threshold models, so the report, label maps and source files are the real thing.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.uid import SegmentationStorage
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import LesionStudy, lesion_study, relabel

from radserve.domain import Volume
from radserve.errors import ReportError
from radserve.report.dicom import common, write_seg
from radserve.report.dicom.seg import _number_segments, build_seg, segment_key
from radserve.report.shortened import output_character_set


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> LesionStudy:
    study = lesion_study(tmp_path_factory.mktemp("seg"))
    assert len(study.report.findings) == 2
    return study


def _frames(ds: pydicom.Dataset) -> list[tuple[int, str]]:
    """(segment number, source SOP Instance UID) of every frame."""
    shared = ds.SharedFunctionalGroupsSequence[0].get("SegmentIdentificationSequence")
    out = []
    for frame in ds.PerFrameFunctionalGroupsSequence:
        ident = frame.get("SegmentIdentificationSequence") or shared
        source = frame.DerivationImageSequence[0].SourceImageSequence[0]
        out.append((int(ident[0].ReferencedSegmentNumber), str(source.ReferencedSOPInstanceUID)))
    return out


@pytest.mark.parametrize("kind", ["organs", "findings"])
def test_seg_round_trip_matches_report_and_label_map(study: LesionStudy, tmp_path: Path, kind: str):
    output, labels = study.label_map(kind)
    path = write_seg(study.report, labels, output.segments, study.files, tmp_path / "x.dcm")
    ds = pydicom.dcmread(path)

    assert ds.SOPClassUID == SegmentationStorage and ds.SegmentationType == "BINARY"
    assert ds.StudyInstanceUID == study.report.study.study_instance_uid
    assert ds.FrameOfReferenceUID == study.report.geometry.frame_of_reference_uid
    assert ds.SeriesInstanceUID != study.report.study.series_instance_uid
    assert ds.PatientID == "PHANTOM-0001" and str(ds.PatientName) == "Phantom^Test"

    # One segment per described value, numbered 1..n in value order, codes from the report.
    segments = sorted(output.segments, key=lambda s: s.value)
    assert [int(s.SegmentNumber) for s in ds.SegmentSequence] == list(range(1, len(segments) + 1))
    for item, segment in zip(ds.SegmentSequence, segments, strict=True):
        expected_label = f"Lesion {segment.finding_id}" if kind == "findings" else segment.label
        assert item.SegmentLabel == expected_label == item.TrackingID
        assert item.TrackingUID == common.tracking_uid(study.report, segment_key(segment))
        assert item.SegmentedPropertyTypeCodeSequence[0].CodeValue == segment.concept.value
        assert item.SegmentedPropertyCategoryCodeSequence[0].CodeValue == segment.category.value
        algorithm = item.SegmentationAlgorithmIdentificationSequence[0]
        assert (algorithm.AlgorithmName, algorithm.AlgorithmVersion) == (
            segment.model,
            segment.model_version,
        )
        if kind == "findings":
            assert item.AnatomicRegionSequence[0].CodeValue == "10200004"  # liver

    # Every frame equals the label map on the source slice it references; nothing missing.
    slice_of = {u: k for k, u in enumerate(study.report.geometry.source_sop_instance_uids)}
    pixels = ds.pixel_array.reshape(-1, ds.Rows, ds.Columns)
    frames = _frames(ds)
    for (number, uid), frame in zip(frames, pixels, strict=True):
        value = segments[number - 1].value
        np.testing.assert_array_equal(frame.astype(bool), labels.array[slice_of[uid]] == value)
    for number, segment in enumerate(segments, start=1):
        occupied = {k for k in range(labels.shape[0]) if (labels.array[k] == segment.value).any()}
        assert {slice_of[u] for n, u in frames if n == number} == occupied  # empty frames omitted

    # radserve and the model are named as contributing (processing) equipment.
    equipment = [e for e in ds.ContributingEquipmentSequence if e.Manufacturer == "radserve"]
    assert {e.ManufacturerModelName for e in equipment} == {s.model for s in segments}
    assert equipment[0].PurposeOfReferenceCodeSequence[0].CodeValue == "109102"
    assert ds.Manufacturer == "radserve"


def test_seg_reads_back_with_highdicom(study: LesionStudy, tmp_path: Path) -> None:
    output, labels = study.label_map("findings")
    path = write_seg(study.report, labels, output.segments, study.files, tmp_path / "f.dcm")
    seg = hd.seg.segread(path)
    uids = study.report.geometry.source_sop_instance_uids
    key = study.report.findings[0].key_slice_index
    mask = seg.get_pixels_by_source_instance(
        source_sop_instance_uids=[uids[key]], segment_numbers=[1], skip_overlap_checks=True
    )
    np.testing.assert_array_equal(mask[0, ..., 0].astype(bool), labels.array[key] == 1)


def test_same_report_gives_same_uids(study: LesionStudy, tmp_path: Path) -> None:
    output, labels = study.label_map("findings")
    a = pydicom.dcmread(
        write_seg(study.report, labels, output.segments, study.files, tmp_path / "a")
    )
    b = pydicom.dcmread(
        write_seg(study.report, labels, output.segments, study.files, tmp_path / "b")
    )
    assert a.SOPInstanceUID == b.SOPInstanceUID and a.SeriesInstanceUID == b.SeriesInstanceUID


def test_whole_study_folder_may_be_passed(study: LesionStudy, tmp_path: Path) -> None:
    output, labels = study.label_map("findings")
    extra = make_ct_series(tmp_path / "other", n_slices=2, series_number=7)
    path = write_seg(
        study.report, labels, output.segments, [*extra, *study.files], tmp_path / "x.dcm"
    )
    assert pydicom.dcmread(path, stop_before_pixels=True).NumberOfFrames > 0


def test_grid_mismatch_is_refused(study: LesionStudy, tmp_path: Path) -> None:
    output, labels = study.label_map("findings")
    shifted = Volume(labels.array, labels.affine + _shift(5.0))
    with pytest.raises(ReportError, match="does not match the report geometry"):
        write_seg(study.report, shifted, output.segments, study.files, tmp_path / "x.dcm")


def _shift(mm: float) -> np.ndarray:
    shift = np.zeros((4, 4))
    shift[0, 3] = mm
    return shift


def test_missing_source_files_are_named_by_count(study: LesionStudy, tmp_path: Path) -> None:
    output, labels = study.label_map("findings")
    with pytest.raises(ReportError, match="5 of 30 source instances"):
        write_seg(study.report, labels, output.segments, study.files[5:], tmp_path / "x.dcm")


def test_empty_label_map_is_refused(study: LesionStudy, tmp_path: Path) -> None:
    output, labels = study.label_map("findings")
    empty = labels.with_array(np.zeros_like(labels.array))
    with pytest.raises(ReportError, match="no described segment has a voxel"):
        write_seg(study.report, empty, output.segments, study.files, tmp_path / "x.dcm")


def test_undescribed_and_empty_segments_are_left_out(study: LesionStudy, tmp_path: Path) -> None:
    output, labels = study.label_map("findings")
    array = labels.array.copy()
    array[0, 0, 0] = 9  # a value no segment describes
    ghost = output.segments[0].model_copy(update={"value": 5, "finding_id": 5})  # no voxels
    path = write_seg(
        study.report, labels.with_array(array), [*output.segments, ghost], study.files,
        tmp_path / "x.dcm",
    )  # fmt: skip
    ds = pydicom.dcmread(path)
    assert [s.SegmentLabel for s in ds.SegmentSequence] == ["Lesion 1", "Lesion 2"]


def test_renumbered_values_give_the_same_seg(study: LesionStudy, tmp_path: Path) -> None:
    """Values already 1..n are handed to highdicom as a view of the label map (no
    full-volume copy: issue 19, goal 4); other values are renumbered into a copy of the
    occupied slab, or in the caller's map where it is the caller's to discard. Every path
    must write the same frames, pixels and functional groups."""
    output, labels = study.label_map("findings")
    assert sorted(s.value for s in output.segments) == [1, 2]
    kept, slab, first = _number_segments(labels.array, output.segments)
    assert np.shares_memory(slab, labels.array) and len(kept) == 2
    assert slab.shape[0] < labels.shape[0]  # only the slices from first to last lesion
    shifted = labels.with_array((labels.array * 3 + 4) * (labels.array > 0))  # 1, 2 -> 7, 10
    moved = [s.model_copy(update={"value": s.value * 3 + 4}) for s in output.segments]
    kept_moved, numbered, first_moved = _number_segments(shifted.array, moved)
    assert [s.value for s in kept_moved] == [7, 10]
    assert not np.shares_memory(numbered, shifted.array) and first_moved == first
    np.testing.assert_array_equal(numbered, slab)
    scratch = shifted.array.copy()  # a map read for one SEG: renumbered where it lies
    _kept, in_place, _first = _number_segments(scratch, moved, in_place=True)
    assert np.shares_memory(in_place, scratch)
    np.testing.assert_array_equal(in_place, slab)

    same = write_seg(study.report, labels, output.segments, study.files, tmp_path / "a.dcm")
    renumbered = write_seg(study.report, shifted, moved, study.files, tmp_path / "b.dcm")
    a, b = pydicom.dcmread(same), pydicom.dcmread(renumbered)
    assert int(a.NumberOfFrames) == len(_frames(a)) > 0
    assert a.PixelData == b.PixelData
    assert a.PerFrameFunctionalGroupsSequence == b.PerFrameFunctionalGroupsSequence
    assert a.SegmentSequence == b.SegmentSequence
    sources = common.slice_sources(study.report, common.read_headers(study.files))
    built = build_seg(study.report, shifted, moved, sources, renumber_in_place=True)
    c = pydicom.dcmread(common.save_atomic(built, tmp_path / "c.dcm"))
    assert c.PixelData == a.PixelData and c.SegmentSequence == a.SegmentSequence
    assert c.PerFrameFunctionalGroupsSequence == a.PerFrameFunctionalGroupsSequence


CHARSETS = {
    "latin1": ("ISO_IR 100", "Müller^Jürgen"),
    "utf8-latin": ("ISO_IR 192", "Müller^Jürgen"),
    "utf8-chinese": ("ISO_IR 192", "王^小明"),
    "gb18030": ("GB18030", "王^小明"),
    "iso2022-japanese": (["", "ISO 2022 IR 87"], "Yamada^Tarou=山田^太郎=やまだ^たろう"),
    "iso2022-korean": (["", "ISO 2022 IR 149"], "Hong^Gildong=洪^吉洞=홍^길동"),
}


@pytest.mark.parametrize("case", sorted(CHARSETS))
def test_patient_name_round_trips_in_source_character_set(
    study: LesionStudy, tmp_path: Path, case: str
) -> None:
    charset, name = CHARSETS[case]
    files = relabel(study.files, tmp_path / "src", name, charset=charset)
    output, labels = study.label_map("findings")
    path = write_seg(study.report, labels, output.segments, files, tmp_path / "x.dcm")
    ds = pydicom.dcmread(path)
    assert str(ds.PatientName) == name
    assert ds.SpecificCharacterSet == charset


def test_text_outside_the_source_repertoire_switches_to_utf8(study: LesionStudy, tmp_path: Path):
    files = relabel(study.files, tmp_path / "src", "Müller^Jürgen", charset="ISO_IR 100")
    output, labels = study.label_map("organs")
    segments = [s.model_copy(update={"model": "肝臓-model"}) for s in output.segments]
    ds = pydicom.dcmread(write_seg(study.report, labels, segments, files, tmp_path / "x.dcm"))
    assert ds.SpecificCharacterSet == "ISO_IR 192"
    assert str(ds.PatientName) == "Müller^Jürgen"
    algorithm = ds.SegmentSequence[0].SegmentationAlgorithmIdentificationSequence[0]
    assert algorithm.AlgorithmName == "肝臓-model"


def test_output_character_set_rules() -> None:
    def source(value: object) -> pydicom.Dataset:
        ds = pydicom.Dataset()
        if value is not None:
            ds.SpecificCharacterSet = value
        return ds

    assert output_character_set(source(None), ["liver"]) is None
    assert output_character_set(source(None), ["Leber-Läsion"]) == "ISO_IR 192"
    assert output_character_set(source("ISO_IR 100"), ["Läsion"]) == "ISO_IR 100"
    assert output_character_set(source("ISO_IR 100"), ["病変"]) == "ISO_IR 192"
    assert output_character_set(source("GB18030"), ["病变"]) == "GB18030"
    assert output_character_set(source(["", "ISO 2022 IR 87"]), ["x"]) == [
        "",
        "ISO 2022 IR 87",
    ]


def test_no_patient_name_in_warnings_or_logs(
    study: LesionStudy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # one component: highdicom would warn with it
    files = relabel(study.files, tmp_path / "src", "GEHEIMNAME", charset="ISO_IR 100")
    output, labels = study.label_map("findings")
    with caplog.at_level(logging.DEBUG), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = write_seg(study.report, labels, output.segments, files, tmp_path / "x.dcm")
    assert "GEHEIMNAME" not in caplog.text
    assert not [w for w in caught if "GEHEIMNAME" in str(w.message)]
    assert str(pydicom.dcmread(out).PatientName) == "GEHEIMNAME"


def test_malformed_patient_attributes_do_not_fail_the_seg(
    study: LesionStudy, tmp_path: Path
) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    files = []
    for path in study.files:
        ds = pydicom.dcmread(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pydicom warns about the values we break
            ds.PatientSex, ds.PatientBirthDate, ds.StudyTime = "W", "1970", "25:00"
        ds.save_as(folder / path.name)
        files.append(folder / path.name)
    output, labels = study.label_map("findings")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = write_seg(study.report, labels, output.segments, files, tmp_path / "x")
    assert not [w for w in caught if "1970" in str(w.message)]  # birth date never quoted
    ds = pydicom.dcmread(out)
    assert (ds.PatientSex, ds.PatientBirthDate, ds.StudyTime) == ("", "", "")
    assert ds.PatientID == "PHANTOM-0001"
