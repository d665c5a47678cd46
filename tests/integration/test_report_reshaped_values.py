"""Copied values the DICOM results cannot carry as they came are fitted and said.

A PACS probe (session 36): a Patient's Name of six components and four groups was copied
as it came, and dciodvfy refused the SEG and SR ("Too many delimiters (^) in
PersonName"); a birth date 19561320 went out empty with no report warning, while a
10-byte one got value_shortened."""

from __future__ import annotations

import shutil
from pathlib import Path

import pydicom
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesions_hu, run_test_pipeline

from radserve.report.dicom import write_dicom_results

NAME = "Al^Be^Ce^De^Ee^Fe=Ge=He=Ie"


def test_a_name_of_too_many_components_and_an_invalid_date_are_fitted_and_said(
    tmp_path: Path,
) -> None:
    files = make_ct_series(
        tmp_path / "study", n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
        extra={"PatientName": NAME, "PatientBirthDate": "19561320"},
    )  # fmt: skip
    report = run_test_pipeline(tmp_path).report
    said = [w.message for w in report.warnings if w.code == "value_shortened"]
    assert any("Patient's Name (0010,0010) has more than 3 component groups" in m for m in said)
    assert any("Patient's Birth Date (0010,0030) is not a valid DA" in m for m in said)
    results = write_dicom_results(report, tmp_path / "out", files)
    for path in results:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert str(ds.PatientName) == "Al^Be^Ce^De^Ee Fe=Ge=He", path.name
        assert ds.PatientBirthDate == ""
    if shutil.which("dciodvfy"):
        from tests.factories.dciodvfy import dciodvfy_errors

        for path in results:
            assert not [e for e in dciodvfy_errors(path) if "PersonName" in e], path.name
