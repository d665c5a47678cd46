"""DICOM results of an Enhanced (multi-frame) CT source: the SEG has the one instance as
its source image and names each frame; the SR and key images name the frame; the FHIR
ImagingStudy counts one instance. What a SEG cannot express is refused with the reason.

The study is one Enhanced CT instance whose frames are stored shuffled, so a writer that
took slice k for frame k + 1 would reference the wrong frames.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from tests.factories.dicom_series import make_ct_series, make_enhanced_series, new_uid
from tests.factories.results import LesionStudy, enhanced_lesion_study

from radserve.errors import ReportError
from radserve.ingest import discover_series, load_series
from radserve.report.dicom import write_dicom_results, write_seg
from radserve.report.dicom.frames import (
    SourceFramesError,
    check_loaded_references,
    check_slice_references,
)


@pytest.fixture(scope="module")
def enhanced(tmp_path_factory: pytest.TempPathFactory) -> LesionStudy:
    study = enhanced_lesion_study(tmp_path_factory.mktemp("enhanced"), key_images=True)
    assert len(study.report.findings) == 2
    return study


@pytest.fixture(scope="module")
def written(enhanced: LesionStudy, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("written") / "out"
    shutil.copytree(enhanced.out, out)
    return write_dicom_results(enhanced.report, out, enhanced.files, key_images=True)


def _source(study: LesionStudy) -> Dataset:
    return pydicom.dcmread(study.files[0], stop_before_pixels=True)


def _position(source: Dataset, frame_number: int) -> np.ndarray:
    item = source.PerFrameFunctionalGroupsSequence[frame_number - 1]
    return np.asarray(item.PlanePositionSequence[0].ImagePositionPatient, dtype=float)


def _images(item: Dataset) -> Iterator[Dataset]:
    """Every IMAGE content item of an SR content tree (the SR's own references)."""
    for child in item.get("ContentSequence", []):
        if child.ValueType == "IMAGE":
            yield child
        yield from _images(child)


def test_report_names_the_frame_of_every_slice(enhanced: LesionStudy) -> None:
    source, geometry = _source(enhanced), enhanced.report.geometry
    assert set(geometry.source_sop_instance_uids) == {source.SOPInstanceUID}
    numbers = geometry.source_frame_numbers
    assert sorted(numbers) == list(range(1, 31)) and numbers != sorted(numbers)  # shuffled
    affine = np.asarray(geometry.affine)
    for k, n in enumerate(numbers):  # slice k lies where its frame lies
        np.testing.assert_allclose(affine[:3, 0] * k + affine[:3, 3], _position(source, n), 1e-6)


@pytest.mark.parametrize("kind", ["organs", "findings"])
def test_seg_references_the_source_frame_of_each_of_its_frames(
    enhanced: LesionStudy, tmp_path: Path, kind: str
) -> None:
    output, labels = enhanced.label_map(kind)
    path = write_seg(enhanced.report, labels, output.segments, enhanced.files, tmp_path / "s.dcm")
    ds, source = pydicom.dcmread(path), _source(enhanced)
    numbers = enhanced.report.geometry.source_frame_numbers
    values = sorted(s.value for s in output.segments)
    shared = ds.SharedFunctionalGroupsSequence[0]
    assert shared.PlaneOrientationSequence[0].ImageOrientationPatient == (
        source.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence[0].ImageOrientationPatient
    )
    pixels = ds.pixel_array.reshape(-1, ds.Rows, ds.Columns)
    seen = set()
    for frame, plane in zip(ds.PerFrameFunctionalGroupsSequence, pixels, strict=True):
        [reference] = frame.DerivationImageSequence[0].SourceImageSequence
        assert reference.ReferencedSOPInstanceUID == source.SOPInstanceUID
        assert reference.ReferencedSOPClassUID == source.SOPClassUID
        n = int(reference.ReferencedFrameNumber)
        k = numbers.index(n)
        position = frame.PlanePositionSequence[0].ImagePositionPatient
        np.testing.assert_allclose(np.asarray(position, float), _position(source, n), atol=1e-6)
        ident = frame.get("SegmentIdentificationSequence") or shared.SegmentIdentificationSequence
        number = int(ident[0].ReferencedSegmentNumber)
        np.testing.assert_array_equal(plane.astype(bool), labels.array[k] == values[number - 1])
        seen.add((number, k))
    expected = {
        (number, k)
        for number, value in enumerate(values, start=1)
        for k in range(labels.shape[0])
        if (labels.array[k] == value).any()
    }
    assert seen == expected  # every occupied slice, each once; empty ones omitted


def test_seg_reads_back_by_source_frame_with_highdicom(
    enhanced: LesionStudy, tmp_path: Path
) -> None:
    output, labels = enhanced.label_map("findings")
    path = write_seg(enhanced.report, labels, output.segments, enhanced.files, tmp_path / "f.dcm")
    seg = hd.seg.segread(path)
    key = enhanced.report.findings[0].key_slice_index
    frame = enhanced.report.geometry.source_frame_numbers[key]
    mask = seg.get_pixels_by_source_frame(
        source_sop_instance_uid=_source(enhanced).SOPInstanceUID,
        source_frame_numbers=[frame],
        segment_numbers=[1],
        skip_overlap_checks=True,
    )
    np.testing.assert_array_equal(mask[0, ..., 0].astype(bool), labels.array[key] == 1)


def test_sr_names_the_frame_in_every_image_reference(
    enhanced: LesionStudy, written: list[Path]
) -> None:
    source, report = _source(enhanced), enhanced.report
    sr = pydicom.dcmread(next(p for p in written if p.name == "measurements-sr.dcm"))
    evidence = sr.CurrentRequestedProcedureEvidenceSequence[0].ReferencedSeriesSequence
    referenced = {
        str(i.ReferencedSOPInstanceUID) for s in evidence for i in s.ReferencedSOPSequence
    }
    assert source.SOPInstanceUID in referenced
    assert len(referenced) == 1 + 2  # the source instance once, and the two SEGs
    frames_of_source = []
    for image in _images(sr):
        ref = image.ReferencedSOPSequence[0]
        if ref.ReferencedSOPInstanceUID == source.SOPInstanceUID:
            frames_of_source.append([int(v) for v in np.atleast_1d(ref.ReferencedFrameNumber)])
    assert frames_of_source and all(frames for frames in frames_of_source)
    keys = {report.geometry.source_frame_numbers[f.key_slice_index] for f in report.findings}
    assert keys <= {n for frames in frames_of_source for n in frames}


def test_key_images_reference_their_frame(enhanced: LesionStudy, written: list[Path]) -> None:
    scs = [p for p in written if p.name.endswith("-sc.dcm")]
    assert len(scs) == len(enhanced.report.outputs.key_images) > 0
    numbers = enhanced.report.geometry.source_frame_numbers
    for path, key_image in zip(scs, enhanced.report.outputs.key_images, strict=True):
        ref = pydicom.dcmread(path, stop_before_pixels=True).SourceImageSequence[0]
        assert ref.ReferencedSOPInstanceUID == _source(enhanced).SOPInstanceUID
        assert int(ref.ReferencedFrameNumber) == numbers[key_image.slice_index]


def test_fhir_imaging_study_counts_one_source_instance(
    enhanced: LesionStudy, written: list[Path]
) -> None:
    pytest.importorskip("fhir.resources")
    from fhir.resources.R4B.bundle import Bundle

    from radserve.ingest import PatientInfo
    from radserve.report.fhir import build_fhir_bundle, check_bundle

    results = [pydicom.dcmread(p, stop_before_pixels=True) for p in written]
    bundle = build_fhir_bundle(enhanced.report, PatientInfo(patient_id="P1"), dicom_results=results)
    Bundle.model_validate(bundle)  # fhir.resources raises on an invalid resource
    assert check_bundle(bundle) == []
    by_url = {e["fullUrl"]: e["resource"] for e in bundle["entry"]}
    [diagnostic] = [r for r in by_url.values() if r["resourceType"] == "DiagnosticReport"]
    [study] = [r for r in by_url.values() if r["resourceType"] == "ImagingStudy"]
    assert by_url[diagnostic["imagingStudy"][0]["reference"]] is study
    source = next(
        s for s in study["series"] if s["uid"] == enhanced.report.study.series_instance_uid
    )
    assert source["numberOfInstances"] == 1


def _rewrite(path: Path, out: Path, change: Callable[[Dataset], None]) -> Path:
    ds = pydicom.dcmread(path)
    change(ds)
    out.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(out)
    return out


def _orientation_per_frame(ds: Dataset) -> None:
    """As many scanners write it: Plane Orientation in every frame's groups, not shared."""
    shared = ds.SharedFunctionalGroupsSequence[0]
    orientation = shared.PlaneOrientationSequence
    del shared.PlaneOrientationSequence
    for frame in ds.PerFrameFunctionalGroupsSequence:
        frame.PlaneOrientationSequence = copy.deepcopy(orientation)


def test_orientation_repeated_per_frame_is_accepted(enhanced: LesionStudy, tmp_path: Path) -> None:
    source = _rewrite(enhanced.files[0], tmp_path / "per-frame.dcm", _orientation_per_frame)
    output, labels = enhanced.label_map("findings")
    path = write_seg(enhanced.report, labels, output.segments, [source], tmp_path / "s.dcm")
    shared = pydicom.dcmread(path).SharedFunctionalGroupsSequence[0]
    orientation = shared.PlaneOrientationSequence[0].ImageOrientationPatient
    np.testing.assert_allclose(np.asarray(orientation, float), [1, 0, 0, 0, 1, 0])
    # the source file itself is left as it was (highdicom gets a copy)
    assert (
        "PlaneOrientationSequence" not in pydicom.dcmread(source).SharedFunctionalGroupsSequence[0]
    )


def test_frames_of_differing_orientation_are_refused(enhanced: LesionStudy, tmp_path: Path) -> None:
    def tilt_one_frame(ds: Dataset) -> None:
        _orientation_per_frame(ds)
        item = ds.PerFrameFunctionalGroupsSequence[-1].PlaneOrientationSequence[0]
        item.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]  # a coronal localizer frame

    source = _rewrite(enhanced.files[0], tmp_path / "mixed.dcm", tilt_one_frame)
    output, labels = enhanced.label_map("findings")
    with pytest.raises(SourceFramesError, match=r"differ in orientation \(2 values\)"):
        write_seg(enhanced.report, labels, output.segments, [source], tmp_path / "s.dcm")


def test_a_localizer_frame_of_another_plane_is_refused_before_inference(tmp_path: Path) -> None:
    def localizer_last(ds: Dataset) -> None:
        _orientation_per_frame(ds)
        item = ds.PerFrameFunctionalGroupsSequence[-1].PlaneOrientationSequence[0]
        item.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]

    path = make_enhanced_series(tmp_path / "raw", n_frames=8)
    _rewrite(path, tmp_path / "study" / "enhanced.dcm", localizer_last)
    loaded = load_series(discover_series(tmp_path / "study")[0])
    assert loaded.volume.shape[0] == 7  # the other plane's frame is not in the volume
    with pytest.raises(SourceFramesError, match=r"differ in orientation \(2 values\)"):
        check_loaded_references(loaded)


def test_a_volume_of_several_enhanced_instances_is_refused_before_inference(tmp_path: Path) -> None:
    series, study, frame = new_uid(), new_uid(), new_uid()
    common = {"series_uid": series, "study_uid": study, "frame_of_reference_uid": frame}
    make_enhanced_series(tmp_path, n_frames=4, filename="a.dcm", **common)
    make_enhanced_series(tmp_path, n_frames=4, origin=(0, 0, 8.0), filename="b.dcm", **common)
    [header] = discover_series(tmp_path)
    loaded = load_series(header)
    assert loaded.volume.shape[0] == 8  # one volume of both instances
    with pytest.raises(SourceFramesError, match="2 instances, 2 of them Enhanced"):
        check_loaded_references(loaded)


def test_classic_images_with_number_of_frames_1_stay_single_frame(tmp_path: Path) -> None:
    make_ct_series(tmp_path, n_slices=4, extra={"NumberOfFrames": 1})
    loaded = load_series(discover_series(tmp_path)[0])
    assert [s.frame_number for s in loaded.source_slices] == [None] * 4
    check_loaded_references(loaded)  # nothing to refuse


@pytest.mark.parametrize(
    ("uids", "frames", "error", "match"),
    [
        (("a", "a"), (), ReportError, "schema 2.3 or older"),  # an old report
        # the study's own shape (with its gaps resampled by the site's ingest setting): a
        # study fault (is_study_fault), not radserve's failure
        ((), (), SourceFramesError, "resampled"),
        (("a", "a", "b"), (1, 2, None), SourceFramesError, "2 instances, 1 of them Enhanced"),
        (("a", "a"), (1, 1), ReportError, "same source frame"),
    ],
)
def test_unreferenceable_slices_are_refused(uids, frames, error, match) -> None:
    with pytest.raises(error, match=match):
        check_slice_references(uids, frames)
