"""A CT with no body in it is flagged outside every model's input domain, in the JSON
report, the DICOM SR and the FHIR conclusion, and still gets a report.

Probe (session 37): a volume of air (-1000 HU), or of Pixel Padding Value only, ran and
got a clean "no findings" report whose only flag was ``input_domain_unchecked`` (no fat
peak, no soft tissue to measure): a radiologist reads that as a normal study. The rule
(``radserve.domain.input_domain.body_missing``): voxels above -500 HU filling less than
1 % of the volume are no body, whatever the models declare."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from tests.factories.dicom_series import make_ct_series
from tests.factories.onnx_models import model_spec
from tests.factories.results import lesions_hu, run_test_pipeline

from radserve.domain.input_domain import (
    INPUT_DOMAIN_UNCHECKED,
    OUTSIDE_INPUT_DOMAIN,
    AcquisitionFacts,
    InputDomain,
    Range,
)
from radserve.errors import InputDomainError
from radserve.ingest import PatientInfo
from radserve.pipeline.profile import check_input_domain
from radserve.report.dicom import write_dicom_results
from radserve.report.dicom.notes import QUALITY_ISSUE

pytest.importorskip("fhir.resources")
from tests.factories.dciodvfy import dciodvfy_errors

from radserve.report.fhir import build_fhir_bundle

GRID = {"n_slices": 12, "rows": 96, "cols": 96, "spacing": (2.0, 1.0, 1.0)}
ORIGIN = (-47.5, -47.5, 0.0)


def _air(points: np.ndarray) -> np.ndarray:
    return np.full(points.shape[:-1], -1000.0)


def _undeclared_padding(points: np.ndarray) -> np.ndarray:
    return np.full(points.shape[:-1], -3024.0)  # a scanner's padding, not declared


def _padding(points: np.ndarray) -> np.ndarray:
    return np.full(points.shape[:-1], np.nan)  # every pixel is Pixel Padding Value


def _small_object(points: np.ndarray) -> np.ndarray:
    """A 4 mm cube of soft tissue in a 96 mm field (0.04 % of the voxels)."""
    cube = (np.abs(points - np.array([0.0, 0.0, 10.0])) < 2.0).all(-1)
    return np.where(cube, 60.0, -1000.0)


EMPTY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
    "air": (_air, "no voxel reads above -500 HU"),
    "padding": (_padding, "no voxel reads above -500 HU"),
    "undeclared padding": (_undeclared_padding, "no voxel reads above -500 HU"),
    "small object": (_small_object, "0.0"),
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


@pytest.mark.parametrize("case", sorted(EMPTY))
def test_a_volume_without_a_body_is_flagged_in_the_report_the_sr_and_the_fhir_conclusion(
    tmp_path: Path, case: str
) -> None:
    hu, found = EMPTY[case]
    padding = {"signed": True, "pixel_padding_value": -2000}
    files = make_ct_series(
        tmp_path / "study", **GRID, origin=ORIGIN, hu=hu, **(padding if case != "air" else {})
    )
    report = run_test_pipeline(tmp_path).report  # a report, not a refusal
    assert report.findings == []
    (flag,) = [w for w in report.warnings if w.code == OUTSIDE_INPUT_DOMAIN]
    assert flag.message.startswith(f"no body in view: {found}"), flag.message
    assert "above -500 HU (tissue), less than the 1 % any patient fills" in flag.message
    results = write_dicom_results(report, tmp_path / "out", files)
    sr = next(p for p in results if p.name.endswith("-sr.dcm"))
    if shutil.which("dciodvfy"):
        assert dciodvfy_errors(sr) == []
    assert flag.message in _quality_issues(sr)
    datasets = [pydicom.dcmread(p) for p in results]
    bundle = build_fhir_bundle(report, PatientInfo(patient_id="P1"), dicom_results=datasets)
    (diagnostic,) = [
        e["resource"]
        for e in bundle["entry"]
        if e["resource"]["resourceType"] == "DiagnosticReport"
    ]
    assert "Note: No body in view: " in diagnostic["conclusion"]


def test_a_study_with_a_body_is_not_flagged(tmp_path: Path) -> None:
    make_ct_series(
        tmp_path / "study", n_slices=30, rows=64, cols=64, spacing=(1.5, 1.0, 1.0),
        origin=(-31.5, -31.5, -0.75), hu=lesions_hu,
    )  # fmt: skip
    report = run_test_pipeline(tmp_path).report
    assert report.findings
    assert [w for w in report.warnings if w.code == OUTSIDE_INPUT_DOMAIN] == []


def _facts(share: float | None, modality: str = "CT") -> AcquisitionFacts:
    return AcquisitionFacts(modality, 0.8, 2.0, 512, 512, 100, "", body_share=share)


def test_the_rule_is_one_share_of_the_volume_for_ct_only() -> None:
    spec = model_spec()
    flagged = [c for c, _ in check_input_domain(_facts(0.0099), [spec], refuse=False)]
    assert flagged == [OUTSIDE_INPUT_DOMAIN]
    assert check_input_domain(_facts(0.01), [spec], refuse=False) == []
    assert check_input_domain(_facts(None), [spec], refuse=False) == []  # not measured
    mr = check_input_domain(_facts(0.0, "MR"), [spec], refuse=False)  # not HU: not judged
    assert [m for _, m in mr if "no body" in m] == []
    # never refused for it, not even under ingest.input_domain: refuse (a report still
    # goes back); a model's own declaration is refused as before
    assert check_input_domain(_facts(0.0), [spec], refuse=True)[0][0] == OUTSIDE_INPUT_DOMAIN
    declared = spec.model_copy(update={"input_domain": InputDomain(matrix=Range(max=256))})
    with pytest.raises(InputDomainError, match="rows 512 outside") as refused:
        check_input_domain(_facts(0.0), [declared], refuse=True)
    assert "no body" not in refused.value.message
    assert INPUT_DOMAIN_UNCHECKED not in [
        c for c, _ in check_input_domain(_facts(0.0), [spec], refuse=False)
    ]
