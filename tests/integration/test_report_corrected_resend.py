"""A study re-sent with a corrected patient: every DICOM result carries the correction.

The gateway and STOW-RS keep both copies of each instance (the second named by its
content), and ingest reads the copy written last. Until session 36 the SEG and SR took
each slice's header from the copy last in the order of the file names instead: a PACS
probe got, for one re-run, a SEG with the corrected patient, a SEG with the old one and
an SR with the old one, while the FHIR Patient named the corrected one."""

from __future__ import annotations

import os
from pathlib import Path

import pydicom
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesions_hu, run_test_pipeline

from radserve.report.dicom import write_dicom_results


def test_the_seg_and_sr_of_a_corrected_re_send_name_the_corrected_patient(
    tmp_path: Path,
) -> None:
    study = tmp_path / "study"
    old = make_ct_series(
        study, n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu, extra={"PatientID": "OLD-ID"},
    )  # fmt: skip
    sent = max(p.stat().st_mtime_ns for p in old)
    corrected = []
    for i, path in enumerate(sorted(old)):
        ds = pydicom.dcmread(path)
        ds.PatientID, ds.PatientName = "NEW-ID", "Corrected^Name"
        # named to sort before the old copies, written after them
        copy = study / f"0-{i:03d}.dcm"
        ds.save_as(copy)
        os.utime(copy, ns=(sent + 10**9, sent + 10**9))
        corrected.append(copy)
    report = run_test_pipeline(tmp_path).report
    files = sorted(p for p in study.iterdir() if p.is_file())
    results = write_dicom_results(report, tmp_path / "out", files)
    assert len(results) >= 2 and any(p.name.endswith("-sr.dcm") for p in results)
    for path in results:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert (ds.PatientID, str(ds.PatientName)) == ("NEW-ID", "Corrected^Name"), path.name
