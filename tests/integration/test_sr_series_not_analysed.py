"""The DICOM SR names each series of the study that was not analysed, and why (the
JSON report's ``series_selection.rejected``): a reader of the SR alone otherwise sees
only the series that ran, in its evidence. Series Number, UID and the rule only."""

from __future__ import annotations

import shutil
from pathlib import Path

import highdicom as hd
import pydicom
import pytest
from pydicom.uid import SecondaryCaptureImageStorage
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_series import make_ct_series, new_uid
from tests.factories.results import lesions_hu, run_test_pipeline

from radserve.report.dicom import write_dicom_results
from radserve.report.dicom.notes import QUALITATIVE_EVALUATIONS, SERIES_NOT_ANALYSED


def _notes(sr: pydicom.Dataset) -> list[str]:
    return [
        str(child.TextValue)
        for item in sr.ContentSequence
        if item.ConceptNameCodeSequence[0].get("CodeValue") == QUALITATIVE_EVALUATIONS.value
        for child in item.ContentSequence
        if child.ConceptNameCodeSequence[0].get("CodeValue") == SERIES_NOT_ANALYSED.value
    ]


@pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy is not installed")
def test_the_sr_names_each_series_not_analysed_with_the_reason(tmp_path: Path) -> None:
    study = new_uid()
    grid = {"rows": 48, "cols": 48, "origin": (-20.0, -20.0, 0.0), "study_uid": study}
    files = make_ct_series(tmp_path / "study" / "ct", n_slices=24, spacing=(2.0, 1.0, 1.0),
                           hu=lesions_hu, series_number=2, **grid)  # fmt: skip
    thick = make_ct_series(tmp_path / "study" / "thick", n_slices=12, spacing=(4.0, 1.0, 1.0),
                           series_number=3, **grid)  # fmt: skip
    dose = make_ct_series(tmp_path / "study" / "dose", n_slices=1, series_number=999,
                          sop_class_uid=SecondaryCaptureImageStorage, **grid)  # fmt: skip
    report = run_test_pipeline(tmp_path).report
    assert report.series_selection.selected is not None
    assert report.series_selection.selected.series_number == 2
    (path,) = [p for p in write_dicom_results(report, tmp_path / "out", files)
               if p.name.endswith("-sr.dcm")]  # fmt: skip
    assert dciodvfy_errors(path) == []
    sr = pydicom.dcmread(path)
    hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))  # highdicom reads it back
    uid = {n: pydicom.dcmread(f[0]).SeriesInstanceUID for n, f in ((3, thick), (999, dose))}
    assert sorted(_notes(sr)) == [
        f"Series 3 ({uid[3]}): another series preferred (thinnest)",
        f"Series 999 ({uid[999]}): Secondary Capture Image Storage is not a volume image class",
    ]
    schemes = [i.CodingSchemeDesignator for i in sr.CodingSchemeIdentificationSequence]
    assert "99RADSERVE" in schemes
