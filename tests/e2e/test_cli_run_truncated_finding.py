"""A lesion cut by the edge of the scan is flagged, not silently measured small.

The lesion study (:func:`tests.factories.results.lesions_hu`) cut so the scan starts
inside the smaller lesion (z = 6..14 mm; the first slice is at 8.25 mm) and holds the
larger one (z = 15..27 mm) whole, run through ``radserve run``: report.json, the SR (read
back with highdicom, checked with dciodvfy), the FHIR Observations and conclusion built
from that report, and the terminal findings table all say the cut one's measurements are
lower bounds, and only its.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import highdicom as hd
import pydicom
import pytest
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import LESIONS, lesions_hu

from radserve.ingest import PatientInfo
from radserve.report.json_report import read_report

CUT = LESIONS[1]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("cut")
    make_ct_series(
        root / "study", n_slices=20, rows=64, cols=64, spacing=(1.5, 1.0, 1.0),
        origin=(-31.5, -31.5, 8.25), hu=lesions_hu,
    )  # fmt: skip
    assert CUT[0][2] - CUT[1] < 8.25 < CUT[0][2] + CUT[1]  # the scan starts inside it
    out = root / "out"
    done = subprocess.run(
        [
            sys.executable, "-c", "from radserve.cli import main; main()", "run",
            str(root / "study"), "--pipeline", str(write_test_pipeline(root)), "--out",
            str(out), "--models-dir", str(write_test_bundles(root / "models")),
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def _by_lesion(report) -> dict[str, object]:
    """The findings keyed 'cut' / 'whole' by their centroid's nearest lesion centre."""
    out = {}
    for f in report.findings:
        (x, y, _), (cx, cy, _) = f.centroid_mm, CUT[0]
        out["cut" if abs(x - cx) + abs(y - cy) < 3 else "whole"] = f
    return out


def test_report_json_flags_only_the_cut_lesion(run) -> None:
    out, _ = run
    raw = json.loads((out / "report.json").read_text())
    assert raw["schema_version"] == "2.7"
    lesions = _by_lesion(read_report(out / "report.json"))
    assert set(lesions) == {"cut", "whole"}
    assert (lesions["cut"].coverage, lesions["cut"].edges) == ("partial", ("first_slice",))
    assert (lesions["whole"].coverage, lesions["whole"].edges) == ("complete", ())


def test_sr_marks_the_cut_lesion_like_a_partial_organ(run) -> None:
    out, _ = run
    lesions = _by_lesion(read_report(out / "report.json"))
    sr = hd.sr.srread(out / "measurements-sr.dcm")
    groups = [
        *sr.content.get_volumetric_roi_measurement_groups(),
        *sr.content.get_image_measurement_groups(),
    ]
    for key, want in (("cut", ["Anatomy coverage incomplete"]), ("whole", [])):
        name = f"Lesion {lesions[key].finding_id}"
        mine = [g for g in groups if g.tracking_identifier == name]
        assert len(mine) == 2  # the segment's group and the RECIST axes' group
        for group in mine:
            evaluations = group.get_qualitative_evaluations()
            assert [e.value.meaning for e in evaluations] == want
            assert all(e.name.meaning == "Quality Issue" for e in evaluations)
    if shutil.which("dciodvfy"):
        assert dciodvfy_errors(out / "measurements-sr.dcm") == []


def test_fhir_gives_lower_bounds_with_a_note_for_the_cut_lesion_only(run) -> None:
    pytest.importorskip("fhir.resources")
    from radserve.report.fhir import build_fhir_bundle

    out, _ = run
    report = read_report(out / "report.json")
    lesions = _by_lesion(report)
    datasets = [pydicom.dcmread(p, stop_before_pixels=True) for p in out.glob("*.dcm")]
    bundle = build_fhir_bundle(report, PatientInfo(patient_id="P1"), dicom_results=datasets)
    resources = [e["resource"] for e in bundle["entry"]]
    for key in ("cut", "whole"):
        name = f"Lesion {lesions[key].finding_id}"
        mine = [
            r for r in resources
            if r["resourceType"] == "Observation" and r["code"]["text"].startswith(name)
        ]  # fmt: skip
        assert len(mine) == 4  # the group, long axis, short axis, volume
        for obs in mine:
            if key == "cut":
                assert "first slice" in obs["note"][0]["text"]
                assert "lower bounds" in obs["note"][0]["text"]
            else:
                assert "note" not in obs
            if "valueQuantity" in obs:
                assert (obs["valueQuantity"].get("comparator") == ">=") == (key == "cut")
    r4 = Path(os.environ.get("RADSERVE_TEST_FHIR_R4_PYTHON", REPO / ".venv-fhir-r4/bin/python"))
    if r4.is_file():  # R4 4.0.1 structures too (the side venv .ci/run makes)
        (out / "bundle.json").write_text(json.dumps(bundle), encoding="utf-8")
        check = subprocess.run(
            [str(r4), str(REPO / "tools/fhir_r4_validate.py"), str(out / "bundle.json")],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert check.returncode == 0 and "ok (FHIR 4.0.1)" in check.stdout, check.stdout
    (diagnostic,) = [r for r in resources if r["resourceType"] == "DiagnosticReport"]
    lines = diagnostic["conclusion"].splitlines()
    (cut_line,) = [ln for ln in lines if f"Lesion {lesions['cut'].finding_id} " in ln]
    (whole_line,) = [ln for ln in lines if f"Lesion {lesions['whole'].finding_id} " in ln]
    assert "at least" in cut_line and "truncated" in cut_line and "first slice" in cut_line
    assert "at least" not in whole_line and "truncated" not in whole_line


def test_terminal_findings_table_shows_lower_bounds(run) -> None:
    out, stdout = run
    lesions = _by_lesion(read_report(out / "report.json"))
    rows = {ln.split("│")[1].strip(): ln for ln in stdout.splitlines() if ln.count("│") > 7}
    assert ">= " in rows[str(lesions["cut"].finding_id)]
    assert ">=" not in rows[str(lesions["whole"].finding_id)]
