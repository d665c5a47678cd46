"""``radserve run`` on a study whose Patient's Name is 65,534 bytes and whose Series
Description and Institution Name hold bytes that are not UTF-8 (ISO_IR 192 declared):
report.json is strict UTF-8 JSON that carries none of them, every DICOM SEG and SR is
dciodvfy-clean with the name cut to PN's 64 characters (logged, without the name; said
with its length, not the name, in report.json and as a Quality Issue in the SR), and
the FHIR Bundle built from the run (the server's one function) parses with fhir.resources.
Series Description and Institution Name are not copied into any output.

A UTF-8 study whose 60-character Greek/CJK Patient's Name, Accession Number and Study
Description are over their VRs' limits in bytes (what dciodvfy counts): SEG, SR and
Secondary Captures are dciodvfy-clean, each value cut on a character boundary, and the
report names each attribute cut (never its value). A Patient's Age, Patient's Weight
and a Context UID in a Procedure Code Sequence item over their VRs' limits (no prefix
of which is valid) are written empty, and named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pydicom
import pytest
from pydicom.datadict import dictionary_VR
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
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


def _utf8_study(folder: Path, elements: dict[Tag, tuple[str, bytes | str]]) -> Path:
    """The phantom study, ISO_IR 192 declared, with ``elements`` written (bytes as they
    are: pydicom would decode them in the phantom's Latin-1 and write that as UTF-8, so a
    placeholder of the same length is written and its bytes replaced in the file)."""
    make_ct_series(
        folder, n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu,
    )  # fmt: skip
    for path in sorted(folder.iterdir()):
        ds = pydicom.dcmread(path)
        ds.SpecificCharacterSet = "ISO_IR 192"
        raw = {}
        for i, (tag, (vr, value)) in enumerate(elements.items()):
            if isinstance(value, bytes):
                raw[(chr(0x7E - i) * len(value)).encode()] = value
                value = chr(0x7E - i) * len(value)
            ds[tag] = DataElement(tag, vr, value)  # pydicom encodes a str as UTF-8
        ds.save_as(path)
        data = path.read_bytes()
        for placeholder, value in raw.items():
            assert data.count(placeholder) == 1
            data = data.replace(placeholder, value)
        path.write_bytes(data)
    return folder


def _run(tmp_path: Path, study: Path, *extra: str) -> tuple[Path, subprocess.CompletedProcess]:
    models, pipeline = write_test_bundles(tmp_path / "models"), write_test_pipeline(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", "from radserve.cli import main; main()", "run", str(study),
         "--pipeline", str(pipeline), "--out", str(out), "--models-dir", str(models), *extra],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return out, done


def test_long_and_not_utf8_header_text_gives_valid_outputs(tmp_path: Path) -> None:
    study = _utf8_study(tmp_path / "study", HOSTILE)
    out, done = _run(tmp_path, study)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Patient's Name has a component group of 65534 bytes; written cut to the 64" in (
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
        "Patient's Name (0010,0010) has a component group of 65534 bytes"
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


NAME = "Παπαδοπούλου^" + "山田太郎" * 8 + "Ελένη" * 3  # 60 characters, 151 bytes as UTF-8
WIDE = {
    "PatientName": NAME,
    "AccessionNumber": "ΑΡ-2026-" + "肝" * 8,  # 16 characters, 34 bytes: SH holds 16
    "StudyDescription": "CT θώρακος/κοιλίας " + "造影" * 15,  # 49 characters, 123 bytes
}


def test_wide_utf8_study_values_fit_their_vrs_in_bytes(tmp_path: Path) -> None:
    assert len(NAME) == 60
    study = _utf8_study(
        tmp_path / "study",
        {Tag(k): (dictionary_VR(k), v) for k, v in WIDE.items()},
    )
    out, done = _run(tmp_path, study, "--sc-key-images")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not any(v[:6] in done.stderr + done.stdout for v in WIDE.values())

    report = Report.model_validate_json((out / "report.json").read_bytes())
    messages = [w.message for w in report.warnings if w.code == "value_shortened"]
    named = ["Patient's Name (0010,0010)", "Accession Number (0008,0050)",
             "Study Description (0008,1030)"]  # fmt: skip
    assert sorted(m.split(" has ")[0] for m in messages) == sorted(named)
    assert not any(v[:6] in m for v in WIDE.values() for m in messages)

    for _path, ds in _valid_seg_sr_sc(out):
        for keyword, value in WIDE.items():
            kept = str(ds[keyword].value)
            limit = 16 if keyword == "AccessionNumber" else 64
            # the longest prefix that fits, whole characters only
            assert value.startswith(kept.rstrip("^")) and len(kept.encode()) <= limit, keyword
            assert len(value[: len(kept) + 1].encode()) > limit, keyword


def _valid_seg_sr_sc(out: Path) -> list[tuple[Path, Dataset]]:
    """The SEG, SR and key-image SCs written to ``out``, each dciodvfy-clean, read."""
    written = sorted(out.glob("*.dcm"))
    assert {"measurements-sr.dcm", "findings-seg.dcm"} <= {p.name for p in written}
    assert any(p.name.endswith("-sc.dcm") for p in written), "key images as SC"
    for path in written:
        assert dciodvfy_errors(path) == [], path.name
    return [(p, pydicom.dcmread(p, stop_before_pixels=True)) for p in written]


def _item(**values: str) -> Dataset:
    item = Dataset()
    for keyword, value in values.items():
        setattr(item, keyword, value)
    return item


MEANING = "CT " + "造影" * 30  # 63 characters, 183 bytes: LO holds 64
OTHER_ID = "Ω" * 40  # 80 bytes
NESTED = {  # inside sequences highdicom copies whole
    Tag("ProcedureCodeSequence"): (
        "SQ",
        Sequence([_item(CodeValue="P1", CodingSchemeDesignator="99X", CodeMeaning=MEANING)]),
    ),
    Tag("OtherPatientIDsSequence"): (
        "SQ",
        Sequence([_item(PatientID=i, TypeOfPatientID="TEXT") for i in ("short", OTHER_ID)]),
    ),
}


def test_values_inside_copied_sequences_fit_their_vrs_too(tmp_path: Path) -> None:
    study = _utf8_study(tmp_path / "study", NESTED)
    out, done = _run(tmp_path, study)
    assert done.returncode == 0, done.stderr[-3000:]
    assert MEANING[:6] not in done.stderr + done.stdout and OTHER_ID[:6] not in done.stderr

    report = Report.model_validate_json((out / "report.json").read_bytes())
    messages = sorted(w.message for w in report.warnings if w.code == "value_shortened")
    assert [m.split(" has ")[0] for m in messages] == [
        "Code Meaning (0008,0104) in Procedure Code Sequence (0008,1032) item 1",
        "Patient ID (0010,0020) in Other Patient IDs Sequence (0010,1002) item 2",
    ]
    written = sorted(out.glob("*.dcm"))
    assert {"measurements-sr.dcm", "findings-seg.dcm"} <= {p.name for p in written}
    for path in written:
        assert dciodvfy_errors(path) == [], path.name
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        meaning = ds.ProcedureCodeSequence[0].CodeMeaning
        assert MEANING.startswith(meaning) and len(meaning.encode()) <= 64, path.name
        ids = [item.PatientID for item in ds.OtherPatientIDsSequence]
        assert ids == ["short", "Ω" * 32], path.name


CONTEXT_UID = "1.2." + "3" * 62  # UI: 66 bytes, in an item
NOT_CUTTABLE = {  # no prefix of these is a valid value of their VR
    Tag("PatientAge"): ("AS", "0045Y"),  # AS: 4 bytes
    Tag("PatientWeight"): ("DS", "70.0000000000000001"),  # DS: 16 bytes
    Tag("ProcedureCodeSequence"): (
        "SQ",
        Sequence(
            [
                _item(
                    CodeValue="P1",
                    CodingSchemeDesignator="99X",
                    CodeMeaning="CT chest",
                    ContextUID=CONTEXT_UID,
                )
            ]
        ),
    ),
}


def test_values_that_cannot_be_cut_are_written_empty_and_named(tmp_path: Path) -> None:
    study = _utf8_study(tmp_path / "study", NOT_CUTTABLE)
    out, done = _run(tmp_path, study, "--sc-key-images")
    assert done.returncode == 0, done.stderr[-3000:]

    report = Report.model_validate_json((out / "report.json").read_bytes())
    messages = sorted(w.message for w in report.warnings if w.code == "value_shortened")
    assert [m.split(" has ")[0] for m in messages] == [
        "Context UID (0008,0117) in Procedure Code Sequence (0008,1032) item 1",
        "Patient's Age (0010,1010)",
        "Patient's Weight (0010,1030)",
    ]
    assert all("the DICOM results carry it empty" in m for m in messages), messages
    for path, ds in _valid_seg_sr_sc(out):
        assert ds.get("PatientAge", "") in ("", None), path.name
        assert ds.get("PatientWeight", "") in ("", None), path.name
        items = ds.get("ProcedureCodeSequence", [])
        assert all(not i.get("ContextUID") for i in items), path.name
        if not path.name.endswith("-sc.dcm"):  # the key-image SCs carry neither
            assert [i.CodeMeaning for i in items] == ["CT chest"], path.name


def test_a_type1_value_that_cannot_be_cut_fails_the_run_by_name(tmp_path: Path) -> None:
    ref = _item(ReferencedSOPClassUID="1.2.840.10008.3.1.2.3.1")
    ref.ReferencedSOPInstanceUID = "1." + "3" * 70  # UI: 72 bytes, Type 1 in the item
    study = _utf8_study(tmp_path / "study", {Tag("ReferencedStudySequence"): ("SQ", [ref])})
    out, done = _run(tmp_path, study)
    assert done.returncode == 2, done.stderr[-3000:]
    where = (
        "Referenced SOP Instance UID (0008,1155) in Referenced Study Sequence (0008,1110) "
        "item 1 has a value of 72 bytes"
    )
    refused = f"error [source_value_too_long]: the source's {where}, over the 64 UI allows"
    assert f"{refused}, and it is Type 1" in done.stderr
    assert not list(out.glob("*.dcm"))
    report = Report.model_validate_json((out / "report.json").read_bytes())
    [shortened] = [w.message for w in report.warnings if w.code == "value_shortened"]
    assert shortened.startswith(f"{where}: the DICOM results are not written"), shortened
