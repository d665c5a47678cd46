"""JSON report: round trip, schema export, no patient identity, version gate."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from tests.factories.findings import ellipsoid, label, prediction, spec

from radserve.domain import OrganMeasurement, Volume
from radserve.errors import ReportError
from radserve.postprocess import find_lesions, organ_measurements
from radserve.report import (
    SCHEMA_VERSION,
    Geometry,
    LabelMapOutput,
    ModelRun,
    Outputs,
    PipelineInfo,
    Report,
    ReportWarning,
    RuntimeInfo,
    SeriesRef,
    SeriesSelection,
    StudyInfo,
    finding_segments,
    organ_segments,
    read_report,
    report_json_schema,
    write_json_schema,
    write_report,
)
from radserve.report.fhir.resources import diagnostic_report_uid
from radserve.report.json_report import SCHEMA_PATH
from radserve.report.schema import Lineage
from radserve.service.lineage import diagnostic_report_uid as lineage_report_uid

REPO = Path(__file__).resolve().parents[2]
SHAPE, SPACING = (12, 32, 32), (2.0, 0.8, 0.8)
LESIONS = spec([label(1, "liver lesion", "lesion")], name="lesions")
ORGANS = spec([label(1, "liver"), label(2, "spleen")], name="organs")
PHI_KEYS = ("patientname", "patientid", "patient_name", "patient_id", "birth", "patientsex")


def _report() -> Report:
    mask = ellipsoid(SHAPE, SPACING, (6, 16, 16), (5, 5, 5))
    pred = prediction(mask * 1, Volume.from_geometry(mask, spacing=SPACING).affine, mask * 255)
    uids = tuple(f"1.2.3.4.{i}" for i in range(SHAPE[0]))
    ct = Volume(np.zeros(SHAPE, np.int16), pred.labels.affine, "1.2.3.9", uids)
    lesions = find_lesions(pred, ct, LESIONS)
    return Report(
        generated_at=dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC),
        job_id="job-1",
        study=StudyInfo(
            study_instance_uid="1.2.3",
            series_instance_uid="1.2.3.4",
            accession_number="A123",
            modality="CT",
            study_date=dt.date(2024, 4, 30),
        ),
        pipeline=PipelineInfo(name="abdomen", version="1.0"),
        models=[ModelRun(name="lesions", version="1.0", onnx_sha256="ab" * 32)],
        runtime=RuntimeInfo(providers=["CPUExecutionProvider"], threads=2, device="cpu"),
        series_selection=SeriesSelection(
            selected=SeriesRef(series_instance_uid="1.2.3.4", series_number=3, modality="CT"),
            rejected=[
                SeriesRef(series_instance_uid="1.2.3.5", reason="localizer", instance_count=2)
            ],
        ),
        geometry=Geometry.from_volume(ct),
        findings=lesions.findings,
        finding_axes=lesions.axes,
        organ_measurements=organ_measurements(ct.with_array(mask * 1), ct, ORGANS),
        timings={"inference": 1.25, "postprocess": 0.5},
        paused={"postprocess": 0.25},
        warnings=[ReportWarning(code="missing_slice", message="one gap", stage="ingest")],
        outputs=Outputs(
            label_maps=[
                LabelMapOutput(
                    path="labels/findings.nii.gz",
                    kind="findings",
                    segments=finding_segments(lesions.findings, LESIONS),
                ),
                LabelMapOutput(
                    path="labels/organs.nii.gz", kind="organs", segments=organ_segments(ORGANS)
                ),
            ]
        ),
    )


def test_round_trip(tmp_path: Path) -> None:
    report = _report()
    path = write_report(report, tmp_path / "out" / "report.json")
    back = read_report(path)
    assert back == report
    assert back.findings[0].finding_id == 1
    assert back.geometry.source_sop_instance_uids[back.findings[0].key_slice_index] == "1.2.3.4.6"
    assert back.outputs.label_maps[0].segments[0].finding_id == 1
    assert back.finding_axes[0].long_axis == report.finding_axes[0].long_axis
    assert not list(tmp_path.glob("out/.*"))  # no temporary files left


def test_report_and_schema_carry_no_patient_identity(tmp_path: Path) -> None:
    text = _report().model_dump_json().lower().replace(" ", "")
    schema = json.dumps(report_json_schema()).lower()
    for key in PHI_KEYS:
        assert key not in text and key not in schema
    with pytest.raises(ValidationError, match="PatientName"):
        StudyInfo.model_validate({"study_instance_uid": "1.2", "PatientName": "X"})


def test_unknown_major_version_is_refused(tmp_path: Path) -> None:
    raw = json.loads(_report().model_dump_json())
    raw["schema_version"] = "3.0"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ReportError, match=r"schema_version '3\.0' is not supported"):
        read_report(path)
    path.write_text("{not json")
    with pytest.raises(ReportError, match="not valid JSON"):
        read_report(path)


def test_schema_export_matches_docs(tmp_path: Path) -> None:
    written = write_json_schema(tmp_path / "schema.json")
    schema = json.loads(written.read_text())
    assert schema["title"] == "Report" and "findings" in schema["properties"]
    committed = REPO / SCHEMA_PATH
    assert committed.exists(), "run radserve.report.write_json_schema() to create it"
    assert json.loads(committed.read_text()) == schema, (
        "docs/report-schema.json is stale: regenerate with write_json_schema()"
    )


def test_organ_coverage_round_trips_and_absent_organs_have_no_volume() -> None:
    """Issue 11 (6): the spleen of _report() is absent; 1.0 reported it as 0 ml."""
    report = _report()
    liver, spleen = report.organ_measurements
    assert (liver.coverage, liver.edges) == ("complete", ())
    assert liver.volume_ml is not None and liver.volume_ml > 0
    assert (spleen.coverage, spleen.volume_ml, spleen.mean_hu) == ("not_found", None, None)
    assert read_report_text(report) == report
    with pytest.raises(ValidationError, match="volume_ml is None exactly"):
        OrganMeasurement.model_validate({**spleen.model_dump(), "volume_ml": 0.0})


def read_report_text(report: Report) -> Report:
    from radserve.report.json_report import parse_report, report_json

    return parse_report(report_json(report))


def test_a_1_0_report_is_migrated_on_read(tmp_path: Path) -> None:
    """Stored 1.0 reports stay readable: an organ at 0 ml becomes not found, the others
    keep their volume with a warning that coverage was never checked."""
    raw = json.loads(_report().model_dump_json())
    raw["schema_version"] = "1.0"
    for organ in raw["organ_measurements"]:
        del organ["coverage"], organ["edges"]
    raw["organ_measurements"][1]["volume_ml"] = 0.0
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    back = read_report(path)
    assert back.schema_version == SCHEMA_VERSION
    liver, spleen = back.organ_measurements
    assert (
        liver.coverage == "complete"
        and liver.volume_ml == raw["organ_measurements"][0]["volume_ml"]
    )
    assert (spleen.coverage, spleen.volume_ml) == ("not_found", None)
    assert back.warnings[-1].code == "coverage_not_checked"


def test_a_2_0_report_reads_as_2_1_with_its_label_maps_unchanged(tmp_path: Path) -> None:
    """2.1 only adds (a step per label map, the structures kind): a stored 2.0 report is
    read as it was written, its label maps without a step."""
    report = _report()
    raw = json.loads(report.model_dump_json())
    raw["schema_version"] = "2.0"
    for label_map in raw["outputs"]["label_maps"]:
        label_map.pop("step", None)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    back = read_report(path)
    assert back.schema_version == SCHEMA_VERSION == "2.7"
    assert back.model_dump(exclude={"schema_version"}) == report.model_dump(
        exclude={"schema_version"}
    )


def test_a_2_6_lineage_reads_as_2_7_and_keeps_its_diagnostic_report(tmp_path: Path) -> None:
    """2.7 only adds ``lineage.report_uid``: a 2.6 report's lineage reads with it null,
    and its FHIR DiagnosticReport keeps the identifier derived from study and pipeline
    (a re-run under 2.7 without a visibility rule writes that same identifier)."""
    report = _report().model_copy(update={"lineage": Lineage(generation=2)})
    raw = json.loads(report.model_dump_json())
    raw["schema_version"] = "2.6"
    del raw["lineage"]["report_uid"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    back = read_report(path)
    assert back.schema_version == "2.7" and back.lineage is not None
    assert back.lineage.report_uid is None
    assert diagnostic_report_uid(back) == lineage_report_uid("1.2.3", "abdomen", "")
    assert diagnostic_report_uid(back) != lineage_report_uid("1.2.3", "abdomen", "site:A")
    scoped = Lineage(generation=1, report_uid=lineage_report_uid("1.2.3", "abdomen", "site:A"))
    assert diagnostic_report_uid(back.model_copy(update={"lineage": scoped})) == (scoped.report_uid)


def test_a_2_5_report_reads_as_2_7_without_pauses(tmp_path: Path) -> None:
    """2.6 only adds ``paused``: a 2.5 report (no such field) reads with none."""
    raw = json.loads(_report().model_dump_json())
    raw["schema_version"] = "2.5"
    del raw["paused"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    back = read_report(path)
    assert back.schema_version == "2.7" and back.paused == {}
    assert back.timings == _report().timings


def test_a_2_4_report_reads_as_2_5_without_instance_counts(tmp_path: Path) -> None:
    """2.5 only adds a series' ``instance_count``: a 2.4 report reads with it null."""
    raw = json.loads(_report().model_dump_json())
    raw["schema_version"] = "2.4"
    del raw["series_selection"]["rejected"][0]["instance_count"]
    del raw["series_selection"]["selected"]["instance_count"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    back = read_report(path)
    assert back.schema_version == "2.7"
    assert back.series_selection.rejected[0].instance_count is None
    assert back.series_selection.rejected[0].reason == "localizer"
