"""``radserve run`` on a study whose Patient's Name is 65,534 bytes and whose Series
Description and Institution Name hold bytes that are not UTF-8 (ISO_IR 192 declared):
report.json is strict UTF-8 JSON that carries none of them, every DICOM SEG and SR is
dciodvfy-clean with the name cut to PN's 64 characters (logged, without the name; said
with its length, not the name, in report.json and as a Quality Issue in the SR), and
the FHIR Bundle built from the run (the server's one function) parses with fhir.resources.
Series Description and Institution Name are not copied into any output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pydicom
import pytest
from pydicom.dataelem import RawDataElement
from pydicom.tag import Tag
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesions_hu

pytest.importorskip("fhir.resources")
from radserve.report.schema import Report
from radserve.service.job_fhir import fhir_bundle_for

LONG_NAME = b"A" * 65532 + b"^B"  # the longest value explicit VR's 16-bit length holds
NOT_UTF8 = b"Caf\xe9 \xff\xfe \xc3("
HOSTILE = {
    Tag(0x00100010): ("PN", LONG_NAME),  # Patient's Name
    Tag(0x0008103E): ("LO", NOT_UTF8),  # Series Description
    Tag(0x00080080): ("LO", NOT_UTF8 + b"x" * 65520),  # Institution Name, long as well
}


def _hostile_study(folder: Path) -> Path:
    make_ct_series(
        folder, n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    for path in sorted(folder.iterdir()):
        ds = pydicom.dcmread(path)
        ds.SpecificCharacterSet = "ISO_IR 192"
        for tag, (vr, value) in HOSTILE.items():  # raw: pydicom would re-encode a str
            ds[tag] = RawDataElement(tag, vr, len(value), value, 0, False, True)  # type: ignore[assignment]
        ds.save_as(path)
    return folder


def test_long_and_not_utf8_header_text_gives_valid_outputs(tmp_path: Path) -> None:
    models, pipeline = write_test_bundles(tmp_path / "models"), write_test_pipeline(tmp_path)
    study, out = _hostile_study(tmp_path / "study"), tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", "from radserve.cli import main; main()", "run", str(study),
         "--pipeline", str(pipeline), "--out", str(out), "--models-dir", str(models)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Patient's Name has a component group of 65534 characters; written cut to the 64" in (
        done.stderr
    )
    assert "AAAAAAAAAA" not in done.stderr + done.stdout and "Caf" not in done.stderr

    text = (out / "report.json").read_bytes().decode("utf-8")  # strict: no stray bytes
    assert "AAAAAAAAAA" not in text and "Caf" not in text
    report = Report.model_validate(json.loads(text))
    assert report.findings, "the bright spheres are findings"
    # the report says which attribute the DICOM results carry shortened, and how long it was
    [shortened] = [w for w in report.warnings if w.code == "value_shortened"]
    assert shortened.message.startswith(
        "Patient's Name (0010,0010) has a component group of 65534 characters"
    )

    written = sorted(out.glob("*.dcm"))
    assert {p.name for p in written} >= {"measurements-sr.dcm", "findings-seg.dcm"}
    for path in written:
        assert dciodvfy_errors(path) == [], path.name
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert str(ds.PatientName) == "A" * 64, path.name
        assert "InstitutionName" not in ds and "Caf" not in str(ds.SeriesDescription)
    sr = pydicom.dcmread(out / "measurements-sr.dcm")
    issues = [
        item.TextValue
        for container in sr.ContentSequence
        for item in container.get("ContentSequence", [])
        if item.ValueType == "TEXT"
        and item.ConceptNameCodeSequence[0].CodeMeaning == "Quality Issue"
    ]
    assert issues == [shortened.message]  # the SR says its Patient's Name is cut

    bundle = fhir_bundle_for(report, study, out)  # validated against R4B as it is built
    from fhir.resources.R4B.bundle import Bundle

    parsed = Bundle.model_validate(bundle)
    patients = [e.resource for e in parsed.entry if e.resource.__resource_type__ == "Patient"]
    assert patients and patients[0].name[0].family.startswith("AAAA")
    assert len(patients[0].name[0].family) == 65532  # FHIR has no length limit: kept whole
