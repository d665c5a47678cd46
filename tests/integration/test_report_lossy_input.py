"""A study whose images were lossy compressed runs, and every result says so: the JSON
report (code ``lossy_input``), the DICOM SR (a TEXT "Quality Issue" in TID 1500's
Qualitative Evaluations) and the FHIR DiagnosticReport's conclusion (hostile-input
round 5, session 21: it ran silently, and the probe's 10:1 JPEG 2000 study measured its
lesion at 0.15 ml against 0.27 ml)."""

from __future__ import annotations

import shutil
from pathlib import Path

import highdicom as hd
import pydicom
import pytest
from tests.factories.dicom_series import as_jpeg_baseline, make_ct_series
from tests.factories.results import lesions_hu, run_test_pipeline

from radserve.ingest import PatientInfo
from radserve.report.dicom import write_dicom_results
from radserve.report.dicom.notes import QUALITY_ISSUE

pytest.importorskip("fhir.resources")
from tests.factories.dciodvfy import dciodvfy_errors

from radserve.report.fhir import build_fhir_bundle

LOSSY = {
    "LossyImageCompression": "01",
    "LossyImageCompressionMethod": "ISO_15444_1",
    "LossyImageCompressionRatio": "5",
}


def _quality_issues(path: Path) -> list[str]:
    sr = hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))
    return [
        str(child.TextValue)
        for item in sr.ContentSequence
        if item.ConceptNameCodeSequence[0].CodeValue == "C0034375"
        for child in item.ContentSequence
        if child.ValueType == "TEXT"
        and child.ConceptNameCodeSequence[0].CodeValue == QUALITY_ISSUE.value
    ]


def test_a_lossy_study_is_said_so_in_the_report_the_sr_and_the_fhir_conclusion(
    tmp_path: Path,
) -> None:
    files = make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu, transfer_syntax="1.2.840.10008.1.2.4.91",
        encode_options={"j2k_cr": [5]}, extra=LOSSY,
    )  # fmt: skip
    report = run_test_pipeline(tmp_path).report
    said = [w.message for w in report.warnings if w.code == "lossy_input"]
    assert said == [
        "24 of 24 images were lossy compressed (Lossy Image Compression 01, JPEG 2000; ratio "
        "up to 5:1): the models ran on approximations of the scanner's values, and "
        "measurements (volumes, diameters, densities) may differ from those on the original "
        "images"
    ]
    results = write_dicom_results(report, tmp_path / "out", files)
    sr = next(p for p in results if p.name.endswith("-sr.dcm"))
    if shutil.which("dciodvfy"):
        assert dciodvfy_errors(sr) == []
    assert _quality_issues(sr) == said
    datasets = [pydicom.dcmread(p) for p in results]
    bundle = build_fhir_bundle(report, PatientInfo(patient_id="P1"), dicom_results=datasets)
    (diagnostic,) = [
        e["resource"]
        for e in bundle["entry"]
        if e["resource"]["resourceType"] == "DiagnosticReport"
    ]
    assert f"Note: {said[0]}." in diagnostic["conclusion"]


@pytest.mark.parametrize("lossy", [True, False], ids=["jpeg_baseline", "uncompressed"])
def test_the_seg_of_a_lossy_study_says_lossy_image_compression_01(
    tmp_path: Path, lossy: bool
) -> None:
    """highdicom copies Lossy Image Compression from the first source only: JPEG Baseline
    sources without the attribute gave a SEG saying 00 (PS3.3 C.7.6.1.1.5: an image derived
    from a lossy one is lossy)."""
    files = make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    if lossy:
        as_jpeg_baseline(files, quality=95)
    report = run_test_pipeline(tmp_path).report
    segs = [p for p in write_dicom_results(report, tmp_path / "out", files) if "seg" in p.name]
    assert segs
    for path in segs:
        seg = pydicom.dcmread(path, stop_before_pixels=True)
        assert seg.LossyImageCompression == ("01" if lossy else "00"), path.name
        if shutil.which("dciodvfy"):
            assert dciodvfy_errors(path) == []
