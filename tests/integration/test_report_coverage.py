"""Issue 11 (6): an organ outside or partly outside the scanned range is never a
measured 0 ml — not in the JSON report, the SR, the FHIR Observations nor the
conclusion. Three studies through the test pipeline (threshold organ model):

* ``complete``: the 'liver' block lies wholly inside the volume;
* ``partial``: the block runs past the last slice (the scan stops inside it);
* ``absent``: nothing reaches the organ threshold (the organ is outside the range).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.sr.codedict import codes
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import run_test_pipeline

from radserve.ingest import PatientInfo
from radserve.report.dicom import write_dicom_results
from radserve.report.schema import Report

pytest.importorskip("fhir.resources")
from tests.factories.dciodvfy import dciodvfy_errors

from radserve.report.fhir import build_fhir_bundle

BLOCK_CENTRE = np.array([0.0, 0.0, 21.0])


def _hu(half_z: float):
    def hu(points: np.ndarray) -> np.ndarray:
        half = np.array([20.0, 20.0, half_z])
        block = (np.abs(points - BLOCK_CENTRE) < half).all(-1)
        return np.where(block, 100.0, -1000.0)

    return hu


STUDIES = {
    # 30 slices of 1.5 mm from z = 0 to 43.5: a 20 mm (half) block is inside, a 40 mm
    # one runs past both ends; air everywhere finds no organ.
    "complete": _hu(10.0),
    "partial": _hu(40.0),
    "absent": lambda points: np.full(points.shape[:-1], -1000.0),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Report, list[Path]]]:
    out = {}
    for name, hu in STUDIES.items():
        root = tmp_path_factory.mktemp(name)
        files = make_ct_series(
            root / "study", n_slices=30, rows=64, cols=64, spacing=(1.5, 1.0, 1.0),
            origin=(-31.5, -31.5, 0.0), hu=hu,
        )  # fmt: skip
        report = run_test_pipeline(root).report
        out[name] = (report, write_dicom_results(report, root / "out", files))
    return out


def _organ(report: Report):
    (liver,) = report.organ_measurements
    return liver


def test_json_report_says_complete_partial_or_not_found(results) -> None:
    complete, partial, absent = (_organ(results[k][0]) for k in ("complete", "partial", "absent"))
    assert (complete.coverage, complete.edges) == ("complete", ())
    assert complete.volume_ml == pytest.approx(40 * 40 * 20 / 1000, rel=0.15)
    assert partial.coverage == "partial"
    assert set(partial.edges) == {"first_slice", "last_slice"}
    assert partial.volume_ml is not None and partial.volume_ml > complete.volume_ml
    assert (absent.coverage, absent.volume_ml, absent.mean_hu) == ("not_found", None, None)


def _sr_organ_group(paths: list[Path]):
    sr = hd.sr.srread(next(p for p in paths if p.name.endswith("-sr.dcm")))
    groups = [
        *sr.content.get_volumetric_roi_measurement_groups(),
        *sr.content.get_image_measurement_groups(),
    ]
    (group,) = [g for g in groups if g.tracking_identifier == "liver"]
    return group


def _evaluations(group) -> dict[str, str]:
    return {e.name.meaning: e.value.meaning for e in group.get_qualitative_evaluations()}


def test_sr_has_no_zero_volume(results) -> None:
    complete = _sr_organ_group(results["complete"][1])
    (volume,) = complete.get_measurements(name=codes.SCT.Volume)
    assert float(volume.value) == pytest.approx(_organ(results["complete"][0]).volume_ml, abs=1e-3)
    assert _evaluations(complete) == {}

    partial = _sr_organ_group(results["partial"][1])
    (volume,) = partial.get_measurements(name=codes.SCT.Volume)
    assert float(volume.value) > 0
    assert _evaluations(partial) == {"Quality Issue": "Anatomy coverage incomplete"}

    absent = _sr_organ_group(results["absent"][1])
    assert absent.get_measurements() == []  # no number at all, so no 0 ml
    assert _evaluations(absent) == {"Presence of property": "Presence Undetermined"}


@pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy not installed")
@pytest.mark.parametrize("name", sorted(STUDIES))
def test_sr_passes_dciodvfy(results, name: str) -> None:
    path = next(p for p in results[name][1] if p.name.endswith("-sr.dcm"))
    assert dciodvfy_errors(path) == []


def _bundle(results, name: str) -> dict:
    report, paths = results[name]
    datasets = [pydicom.dcmread(p, stop_before_pixels=True) for p in paths]
    return build_fhir_bundle(report, PatientInfo(patient_id="P1"), dicom_results=datasets)


def _volume_observation(bundle: dict) -> dict:
    (obs,) = [
        e["resource"]
        for e in bundle["entry"]
        if e["resource"]["resourceType"] == "Observation"
        and e["resource"]["code"]["text"] == "Liver volume"
    ]
    return obs


def _conclusion(bundle: dict) -> str:
    (report,) = [
        e["resource"]
        for e in bundle["entry"]
        if e["resource"]["resourceType"] == "DiagnosticReport"
    ]
    return report["conclusion"]


def test_fhir_and_conclusion_never_claim_zero(results) -> None:
    complete = _bundle(results, "complete")
    obs = _volume_observation(complete)
    assert "comparator" not in obs["valueQuantity"] and "note" not in obs
    assert "Liver volume: " in _conclusion(complete)

    partial = _bundle(results, "partial")
    obs = _volume_observation(partial)
    assert obs["valueQuantity"]["comparator"] == ">="
    assert "lower bound" in obs["note"][0]["text"]
    assert "first slice" in obs["note"][0]["text"] and "last slice" in obs["note"][0]["text"]
    assert "Liver volume: at least" in _conclusion(partial)

    absent = _bundle(results, "absent")
    obs = _volume_observation(absent)
    assert "valueQuantity" not in obs
    assert obs["dataAbsentReason"]["coding"][0]["code"] == "not-performed"
    assert "not assessed" in obs["note"][0]["text"]
    conclusion = _conclusion(absent)
    assert "Liver: not assessed" in conclusion
    for bundle in (complete, partial, absent):
        assert " 0.0 ml" not in _conclusion(bundle)
