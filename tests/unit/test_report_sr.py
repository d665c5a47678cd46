"""TID 1500 SR writer: write -> read back with highdicom -> compare with the JSON report."""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.sr.codedict import codes
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesion_study, lesions_hu, relabel, run_test_pipeline

from radserve.errors import ReportError
from radserve.report.dicom import common, write_dicom_results, write_sr
from radserve.report.nifti import read_nifti, write_label_map
from radserve.report.schema import Report


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, list[Path], list[Path]]:
    """The report, the source files and the DICOM results (two SEGs, then the SR)."""
    study = lesion_study(tmp_path_factory.mktemp("sr"))
    assert len(study.report.findings) == 2
    return study.report, study.files, write_dicom_results(study.report, study.out, study.files)


def _ref_uid(item: pydicom.Dataset) -> str:
    return str(item.ReferencedSOPSequence[0].ReferencedSOPInstanceUID)


def _value(group: object, name: object) -> float:
    (measurement,) = group.get_measurements(name=name)  # type: ignore[attr-defined]
    return float(measurement.value)


def test_results_are_two_segs_in_one_series_and_an_sr(written) -> None:
    report, _, paths = written
    assert [p.name for p in paths] == ["organs-seg.dcm", "findings-seg.dcm", "measurements-sr.dcm"]
    organs, findings, sr = (pydicom.dcmread(p, stop_before_pixels=True) for p in paths)
    assert organs.SeriesInstanceUID == findings.SeriesInstanceUID != sr.SeriesInstanceUID
    assert (organs.InstanceNumber, findings.InstanceNumber) == (1, 2)
    assert {organs.Modality, sr.Modality} == {"SEG", "SR"}
    for ds in (organs, findings, sr):
        assert ds.StudyInstanceUID == report.study.study_instance_uid


def test_the_sr_needs_only_the_segs_headers(written, tmp_path: Path) -> None:
    """write_dicom_results keeps a written SEG for the SR only as its header (no frames):
    its SR is the one write_sr builds from the SEG files read back without pixels."""
    report, files, paths = written
    again = write_sr(report, paths[:2], files, tmp_path / "sr.dcm")
    built, rebuilt = (pydicom.dcmread(p) for p in (paths[2], again))
    for ds in (built, rebuilt):  # the build's time stamps: the values that may differ
        for keyword in (
            "ContentDate",
            "ContentTime",
            "InstanceCreationDate",
            "InstanceCreationTime",
        ):
            setattr(ds, keyword, "")
        for item in ds.ContributingEquipmentSequence:
            item.ContributionDateTime = ""
    assert built == rebuilt


def test_sr_round_trip_matches_report(written) -> None:
    report, _, paths = written
    seg = pydicom.dcmread(paths[1], stop_before_pixels=True)
    sr = hd.sr.srread(paths[2])
    assert sr.SOPClassUID == "1.2.840.10008.5.1.4.1.1.88.34"  # Comprehensive 3D SR
    assert (sr.CompletionFlag, sr.VerificationFlag) == ("COMPLETE", "UNVERIFIED")
    content = sr.content
    assert sr.ContentTemplateSequence[0].TemplateIdentifier == "1500"

    segment_by_uid = {s.TrackingUID: int(s.SegmentNumber) for s in seg.SegmentSequence}
    uids = report.geometry.source_sop_instance_uids
    groups = {g.tracking_uid: g for g in content.get_volumetric_roi_measurement_groups()}
    assert len(groups) == len(report.findings) + len(report.organ_measurements)
    linear = {g.tracking_uid: g for g in content.get_image_measurement_groups()}
    assert len(linear) == len(report.findings)
    for finding in report.findings:
        uid = common.tracking_uid(report, common.finding_key(finding.finding_id))
        group = groups[uid]
        assert group.tracking_identifier == f"Lesion {finding.finding_id}"
        assert group.finding_type.value == finding.concept.value
        assert [s.value.value for s in group.finding_sites] == ["10200004"]  # liver
        assert _value(group, codes.SCT.Volume) == pytest.approx(finding.volume_ml, abs=1e-4)
        # The RECIST axes are in a TID 1501 group of the same lesion (TID 1411 forbids
        # coordinates): test_sr_axes_carry_their_endpoints checks them.
        assert linear[uid].tracking_identifier == group.tracking_identifier
        assert _value(linear[uid], codes.SCT.LongAxis) == pytest.approx(
            finding.longest_diameter_mm, abs=1e-4
        )
        assert _value(linear[uid], codes.SCT.ShortAxis) == pytest.approx(
            finding.short_axis_mm, abs=1e-4
        )
        (long_axis,) = linear[uid].get_measurements(name=codes.SCT.LongAxis)
        assert long_axis.unit.value == "mm"
        assert _ref_uid(long_axis.referenced_images[0]) == uids[finding.key_slice_index]
        # The segment reference points at the findings SEG segment with the same tracking UID.
        segment = group.referenced_segment[0]
        assert _ref_uid(segment) == seg.SOPInstanceUID
        assert segment.ReferencedSOPSequence[0].ReferencedSegmentNumber == segment_by_uid[uid]

    (organ,) = report.organ_measurements
    group = groups[common.tracking_uid(report, common.organ_key(organ.model, organ.label_value))]
    assert group.tracking_identifier == "liver"
    assert _value(group, codes.SCT.Volume) == pytest.approx(organ.volume_ml, abs=1e-4)
    (volume,) = group.get_measurements(name=codes.SCT.Volume)
    assert volume.unit.value == "ml"


def test_sr_names_radserve_and_lists_evidence(written) -> None:
    report, _, paths = written
    ds = pydicom.dcmread(paths[2])
    observer = {
        item.ConceptNameCodeSequence[0].CodeMeaning: item.get("TextValue")
        for item in ds.ContentSequence
        if item.RelationshipType == "HAS OBS CONTEXT"
    }
    assert observer["Device Observer Name"] == "radserve"
    assert "lesions-test 1.0.0" in observer["Device Observer Model Name"]
    evidence = {
        str(i.ReferencedSOPInstanceUID)
        for series in ds.CurrentRequestedProcedureEvidenceSequence
        for s in series.ReferencedSeriesSequence
        for i in s.ReferencedSOPSequence
    }
    segs = {str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in paths[:2]}
    assert evidence == set(report.geometry.source_sop_instance_uids) | segs
    radserve = [e for e in ds.ContributingEquipmentSequence if e.Manufacturer == "radserve"]
    assert {e.ManufacturerModelName for e in radserve} == {"organs-test", "lesions-test"}


def _image_to_lps(image: pydicom.Dataset, xy: np.ndarray) -> np.ndarray:
    """SCOORD image coordinates (column, row; (0, 0) = the top left pixel's corner) to
    LPS, from the image's own Image Position/Orientation and Pixel Spacing only."""
    position = np.asarray(image.ImagePositionPatient, float)
    row_dir, col_dir = np.reshape(np.asarray(image.ImageOrientationPatient, float), (2, 3))
    dr, dc = (float(v) for v in image.PixelSpacing)
    c, r = xy[:, 0] - 0.5, xy[:, 1] - 0.5
    return position + np.outer(c * dc, row_dir) + np.outer(r * dr, col_dir)


def _check_axis_endpoints(report: Report, files: list[Path], sr_path: Path) -> int:
    """Each lesion's long and short axis carries its two endpoints twice: SCOORD3D equal to
    the report's LPS endpoints, SCOORD on the key slice that maps to the same points."""
    sr = hd.sr.srread(sr_path)
    headers = {
        str(ds.SOPInstanceUID): ds
        for ds in (pydicom.dcmread(f, stop_before_pixels=True) for f in files)
    }
    groups = {g.tracking_uid: g for g in sr.content.get_image_measurement_groups()}
    axes = {a.finding_id: a for a in report.finding_axes}
    checked = 0
    for finding in report.findings:
        group = groups[common.tracking_uid(report, common.finding_key(finding.finding_id))]
        for name, lps, length in (
            (codes.SCT.LongAxis, axes[finding.finding_id].long_axis_lps,
             finding.longest_diameter_mm),
            (codes.SCT.ShortAxis, axes[finding.finding_id].short_axis_lps,
             finding.short_axis_mm),
        ):  # fmt: skip
            (axis,) = group.get_measurements(name=name)
            assert {c.ValueType for c in axis.referenced_coordinates} == {"SCOORD", "SCOORD3D"}
            scoord3d = next(c for c in axis.referenced_coordinates if c.ValueType == "SCOORD3D")
            assert scoord3d.ReferencedFrameOfReferenceUID == report.geometry.frame_of_reference_uid
            points = np.reshape(scoord3d.GraphicData, (-1, 3))
            np.testing.assert_allclose(points, lps, atol=1e-3)
            assert float(np.linalg.norm(points[1] - points[0])) == pytest.approx(length, abs=1e-3)
            scoord = next(c for c in axis.referenced_coordinates if c.ValueType == "SCOORD")
            assert (scoord.GraphicType, scoord3d.GraphicType) == ("POLYLINE", "POLYLINE")
            image_uid = _ref_uid(scoord.ContentSequence[0])
            assert image_uid == report.geometry.source_sop_instance_uids[finding.key_slice_index]
            xy = np.reshape(scoord.GraphicData, (-1, 2))
            np.testing.assert_allclose(_image_to_lps(headers[image_uid], xy), lps, atol=1e-3)
            checked += 1
    return checked


def test_sr_axes_carry_their_endpoints(written) -> None:
    """Issue 11 (7): with a SEG the axes had no coordinates, so a viewer could not draw them."""
    report, files, paths = written
    assert _check_axis_endpoints(report, files, paths[2]) == 2 * len(report.findings)


def test_sr_without_seg_carries_axis_endpoints(written, tmp_path: Path) -> None:
    report, files, _ = written
    path = write_sr(report, None, files, tmp_path / "sr.dcm")
    assert _check_axis_endpoints(report, files, path) == 2 * len(report.findings)


def test_sr_without_findings(written, tmp_path: Path) -> None:
    report, files, paths = written
    empty = report.model_copy(update={"findings": [], "finding_axes": []})
    sr = hd.sr.srread(write_sr(empty, paths[0], files, tmp_path / "sr.dcm"))
    assert len(sr.content.get_volumetric_roi_measurement_groups()) == 1  # the liver


def test_sr_refuses_other_objects_as_seg(written, tmp_path: Path) -> None:
    report, files, _ = written
    with pytest.raises(ReportError, match="Segmentation Storage"):
        write_sr(report, files[0], files, tmp_path / "sr.dcm")


CHARSETS = {
    "utf8-latin": ("ISO_IR 192", "Müller^Jürgen"),
    "utf8-chinese": ("ISO_IR 192", "王^小明"),
    "gb18030": ("GB18030", "王^小明"),
    "iso2022-japanese": (["", "ISO 2022 IR 87"], "Yamada^Tarou=山田^太郎=やまだ^たろう"),
    "iso2022-korean": (["", "ISO 2022 IR 149"], "Hong^Gildong=洪^吉洞=홍^길동"),
}


@pytest.mark.parametrize("case", sorted(CHARSETS))
def test_patient_name_round_trips_through_sr(written, tmp_path: Path, case: str) -> None:
    report, files, paths = written
    charset, name = CHARSETS[case]
    copies = relabel(files, tmp_path, name, charset=charset)
    ds = pydicom.dcmread(write_sr(report, paths[:2], copies, tmp_path / "sr.dcm"))
    assert str(ds.PatientName) == name
    assert ds.SpecificCharacterSet == charset


def test_no_patient_name_in_warnings_or_logs(
    written, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report, files, paths = written
    copies = relabel(files, tmp_path, "GEHEIMNAME")  # one component: highdicom would warn
    with caplog.at_level(logging.DEBUG), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = write_sr(report, paths[:2], copies, tmp_path / "sr.dcm")
    assert "GEHEIMNAME" not in caplog.text
    assert not [w for w in caught if "GEHEIMNAME" in str(w.message)]
    assert str(pydicom.dcmread(out).PatientName) == "GEHEIMNAME"


def test_results_without_findings_are_organ_seg_and_sr(written, tmp_path: Path) -> None:
    report, files, paths = written
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(paths[0].parent / "organs.nii.gz", out)
    labels = read_nifti(paths[0].parent / "findings.nii.gz")
    write_label_map(labels.with_array(np.zeros_like(labels.array)), out / "findings.nii.gz")
    maps = [
        m.model_copy(update={"segments": []}) if m.kind == "findings" else m
        for m in report.outputs.label_maps
    ]
    empty = report.model_copy(
        update={
            "findings": [],
            "finding_axes": [],
            "outputs": report.outputs.model_copy(update={"label_maps": maps}),
        }
    )
    written_paths = write_dicom_results(empty, out, files)
    assert [p.name for p in written_paths] == ["organs-seg.dcm", "measurements-sr.dcm"]


def test_axis_endpoints_on_an_oblique_series_with_non_square_pixels(tmp_path: Path) -> None:
    """Image coordinates follow the source image's own rows and columns, whatever the
    orientation, pixel shape and slice order."""
    angle = np.deg2rad(25.0)
    row_dir = (np.cos(angle), np.sin(angle), 0.0)
    col_dir = (-np.sin(angle), np.cos(angle), 0.0)
    files = make_ct_series(
        tmp_path / "study", n_slices=30, rows=64, cols=64, spacing=(1.5, 1.0, 0.8),
        orientation=(*row_dir, *col_dir), origin=(-8.0, -40.0, -0.75), hu=lesions_hu,
        order="descending",
    )  # fmt: skip
    report = run_test_pipeline(tmp_path).report
    assert report.findings
    paths = write_dicom_results(report, tmp_path / "out", files)
    assert _check_axis_endpoints(report, files, paths[-1]) == 2 * len(report.findings)
