"""Text copied from a source study into the SEG, SR and failure-notice SR is valid for its
VR and for the character set the object is written in.

A trial (session 42) sent studies whose Study Description held NUL, SOH, an ANSI escape
and CR LF, whose Referring Physician's Name held NUL, DEL and NEL, whose text held bytes
UTF-8 does not define under ISO_IR 192 (read as Latin-1: the results were ISO_IR 100
carrying bytes 0x80 and 0x81), and a Japanese study declaring a single-valued
"ISO 2022 IR 87", whose Patient's Name pydicom wrote with each "ESC ( B" as "ESC $ B".
All were copied as they came; dciodvfy refused the objects ("Character invalid for this
VR", "... for character repertoire"). Every copied value other than the patient and
request identifiers (refused at ingest, never altered) now loses what its VR does not
admit, and the character set is declared in the form pydicom writes faithfully."""

from __future__ import annotations

import datetime as dt
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from tests.factories.results import LesionStudy, lesion_study

from radserve.report.dicom import write_dicom_results
from radserve.report.dicom.failure import build_failure_sr
from radserve.report.shortened import (
    clean_copied,
    copied_text,
    output_character_set,
    shortened_values,
)

JP_NAME = "Yamada^Tarou=山田^太郎=やまだ^たろう"
# PS3.5 H.3.1's example bytes of JP_NAME in ISO 2022 IR 87
JP_NAME_BYTES = (
    b"Yamada^Tarou=\x1b$B;3ED\x1b(B^\x1b$BB@O:\x1b(B=\x1b$B$d$^$@\x1b(B^\x1b$B$?$m$&\x1b(B"
)
JP_TEXT_BYTES = b"\x1b$B;3ED\x1b(B CT \x1b$B$d$^$@\x1b(B"  # a Study Description
JP_TEXT = "山田 CT やまだ"

HOSTILE = {  # keyword: (value as UTF-8 text, what the results carry)
    "StudyDescription": ("SD\x00\x01\x1b[2J\r\nFAKE: job failed", "SD[2JFAKE: job failed"),
    "ReferringPhysicianName": ("RP\x00\x7f\x85^X", "RP^X"),
    "StudyID": ("ID\t7", "ID7"),
    "PatientComments": ("line 1\r\nline 2\x00\x1b\f", "line 1\r\nline 2\f"),  # LT: CR LF FF
    "PatientSexNeutered": ("ALT\x07ERED", ""),  # CS: another code without it: empty
}
BAD_UTF8 = {  # ISO_IR 192 declared over bytes that are not UTF-8 (read as Latin-1)
    "StudyDescription": (b"SD\xed\xa0\x80surrogate\xc0\xaf", "SDí\xa0surrogateÀ¯"),
    "ReferringPhysicianName": (b"RP\x80^\x81", "RP^"),
}
_ADMITTED = {"ST": "\t\n\f\r", "LT": "\t\n\f\r", "UT": "\t\n\f\r"}
_STRING_VRS = {"AE", "AS", "CS", "DA", "DS", "DT", "IS", "LO", "LT", "PN", "SH", "ST", "TM"}
_STRING_VRS |= {"UC", "UI", "UR", "UT"}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> LesionStudy:
    return lesion_study(tmp_path_factory.mktemp("copied-text"))


def _copies(
    study: LesionStudy,
    folder: Path,
    charset: str | list[str],
    raw: dict[str, bytes],
    items: dict[str, Sequence] | None = None,
) -> list[Path]:
    """Copies of the study's files declaring ``charset``, with ``raw`` written as these
    bytes (pydicom writes bytes as they are) and ``items`` as sequences."""
    folder.mkdir(parents=True)
    out = []
    for path in study.files:
        ds = pydicom.dcmread(path)
        ds.SpecificCharacterSet = charset
        for keyword, value in raw.items():
            tag = tag_for_keyword(keyword)
            ds[tag] = DataElement(tag, dictionary_VR(tag), value)
        for keyword, sequence in (items or {}).items():
            setattr(ds, keyword, sequence)
        with warnings.catch_warnings():  # pydicom warns for ASCII under "ISO 2022 IR 87"
            warnings.simplefilter("ignore")
            ds.save_as(folder / path.name)
        out.append(folder / path.name)
    return out


def _results(study: LesionStudy, files: list[Path], root: Path) -> list[Path]:
    """The SEGs and SR written from ``files``, and the failure notice SR from them."""
    out = root / "out"
    shutil.copytree(study.out, out)
    paths = write_dicom_results(study.report, out, files)
    assert [p.name for p in paths] == ["organs-seg.dcm", "findings-seg.dcm", "measurements-sr.dcm"]
    headers = [pydicom.dcmread(f, stop_before_pixels=True) for f in files]
    notice = build_failure_sr(
        headers,
        job_id="job-1",
        error_code="model_failed",
        reason="the model failed",
        when=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    )
    notice.save_as(root / "failure-sr.dcm", enforce_file_format=True)
    return [*paths, root / "failure-sr.dcm"]


def _strings(ds: Dataset) -> Iterator[tuple[str, str, str]]:
    """(keyword, VR, value) of every string value in ``ds``, in its sequences too."""
    for element in ds:
        if element.VR == "SQ":
            for item in element.value:
                yield from _strings(item)
        elif element.VR in _STRING_VRS and element.value not in (None, ""):
            many = isinstance(element.value, pydicom.multival.MultiValue)
            for value in element.value if many else [element.value]:
                yield element.keyword, element.VR, str(value)


def _not_admitted(ds: Dataset) -> list[str]:
    """Keywords of values holding a control character their VR does not admit, or
    pydicom's replacement character (bytes it could not decode)."""
    return [
        keyword
        for keyword, vr, value in _strings(ds)
        if any(
            c == "\ufffd"
            or ((ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0) and c not in _ADMITTED.get(vr, ""))
            for c in value
        )
    ]


def _dciodvfy_clean(path: Path) -> None:
    if shutil.which("dciodvfy") is None:
        return
    from tests.factories.dciodvfy import dciodvfy_errors

    assert dciodvfy_errors(path) == [], path.name


def test_control_characters_in_copied_text_are_not_written(
    study: LesionStudy, tmp_path: Path
) -> None:
    meaning = ("CT\tchest\x1b[1m", "CTchest[1m")
    procedure = Sequence([Dataset()])
    procedure[0].CodeValue, procedure[0].CodingSchemeDesignator = "P1", "99X"
    procedure[0].CodeMeaning = meaning[0]
    files = _copies(
        study,
        tmp_path / "src",
        "ISO_IR 192",
        {k: v.encode() for k, (v, _) in HOSTILE.items()},
        {"ProcedureCodeSequence": procedure},
    )
    for path in _results(study, files, tmp_path):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert _not_admitted(ds) == [], path.name
        for keyword, (_, carried) in HOSTILE.items():
            if keyword in ds:  # the failure notice copies the study's identifiers only
                assert str(ds[keyword].value) == carried, (path.name, keyword)
        if "ProcedureCodeSequence" in ds:
            assert ds.ProcedureCodeSequence[0].CodeMeaning == meaning[1]
        assert str(ds.PatientName) == "Phantom^Test" and ds.PatientID == "PHANTOM-0001"
        _dciodvfy_clean(path)
    names = [
        m.split(" holds ")[0]
        for c, m in shortened_values(pydicom.dcmread(files[0]))
        if "control characters" in m
    ]
    assert sorted(names) == sorted(
        [
            "Study Description (0008,1030)",
            "Referring Physician's Name (0008,0090)",
            "Study ID (0020,0010)",
            "Patient Comments (0010,4000)",
            "Patient's Sex Neutered (0010,2203)",
            "Code Meaning (0008,0104) in Procedure Code Sequence (0008,1032) item 1",
        ]
    )


def test_bytes_utf8_does_not_define_are_not_written(study: LesionStudy, tmp_path: Path) -> None:
    files = _copies(study, tmp_path / "src", "ISO_IR 192", {k: v for k, (v, _) in BAD_UTF8.items()})
    for path in _results(study, files, tmp_path):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert ds.SpecificCharacterSet == "ISO_IR 100", path.name  # read as Latin-1
        assert _not_admitted(ds) == [], path.name
        for keyword, (_, carried) in BAD_UTF8.items():
            if keyword in ds:
                assert str(ds[keyword].value) == carried, (path.name, keyword)
                # no byte ISO 8859-1 leaves undefined (0x80-0x9F) in the file
                raw = pydicom.dcmread(path, stop_before_pixels=True).get_item(keyword).value
                assert not any(0x80 <= b < 0xA0 for b in raw), (path.name, keyword)
        _dciodvfy_clean(path)


def test_single_valued_iso_2022_ir_87_is_written_with_an_empty_first_value(
    study: LesionStudy, tmp_path: Path
) -> None:
    files = _copies(
        study,
        tmp_path / "src",
        "ISO 2022 IR 87",
        {
            "PatientName": JP_NAME_BYTES,
            "ReferringPhysicianName": JP_NAME_BYTES,
            "StudyDescription": JP_TEXT_BYTES,
        },
    )
    for path in _results(study, files, tmp_path):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert ds.SpecificCharacterSet == ["", "ISO 2022 IR 87"], path.name
        # the escape sequences as PS3.5 writes them: ESC ( B back to ASCII before ^ and =
        assert ds.get_item("PatientName").value.rstrip(b" ") == JP_NAME_BYTES, path.name
        assert str(ds.PatientName) == JP_NAME, path.name
        assert str(ds.ReferringPhysicianName) == JP_NAME, path.name
        if "StudyDescription" in ds:
            assert ds.StudyDescription == JP_TEXT, path.name
        _dciodvfy_clean(path)


def test_a_character_set_pydicom_does_not_write_faithfully_is_replaced_by_utf8(
    study: LesionStudy, tmp_path: Path
) -> None:
    """pydicom 3 writes GB 2312 (ISO 2022 IR 58) without its escape sequence and leaves
    the one it read in the decoded text: the results are UTF-8, the escape dropped."""
    files = _copies(
        study,
        tmp_path / "src",
        ["", "ISO 2022 IR 58"],
        {
            "StudyDescription": b"CT \x1b$)A\xd5\xc5 x",
            # GB 2312 ideographic group: pydicom's decoded name keeps ESC $ ) A, which
            # ingest's PN decoding (radserve.ingest.person_name) does not
            "PatientName": b"Zhang^San=\x1b$)A\xd5\xc5^\x1b$)A\xc8\xfd",
        },
    )
    for path in _results(study, files, tmp_path):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        if "StudyDescription" in ds:  # the failure notice copies identifiers only
            assert ds.SpecificCharacterSet == "ISO_IR 192", path.name
            assert ds.StudyDescription == "CT 张 x", path.name
        assert str(ds.PatientName) == "Zhang^San=张^三", path.name
        assert _not_admitted(ds) == [], path.name


def test_the_character_set_rules() -> None:
    source = Dataset()
    source.SpecificCharacterSet = "ISO 2022 IR 87"
    assert output_character_set(source, ["x"]) == ["", "ISO 2022 IR 87"]
    source.SpecificCharacterSet = ["ISO 2022 IR 6", "ISO 2022 IR 87"]
    assert output_character_set(source, ["x"]) == ["ISO 2022 IR 6", "ISO 2022 IR 87"]
    source.SpecificCharacterSet = "ISO 2022 IR 149"
    assert output_character_set(source, ["x"]) == ["", "ISO 2022 IR 149"]
    source.SpecificCharacterSet = "ISO_IR 100"
    assert output_character_set(source, ["Läsion"]) == "ISO_IR 100"


def test_copied_text_keeps_only_what_the_vr_admits() -> None:
    assert copied_text("LO", "a\tb\r\nc\x00\x7f\x85\ufffdd") == "abcd"
    assert copied_text("LT", "a\tb\r\nc\x00\f") == "a\tb\r\nc\f"
    assert copied_text("LO", "CT \x1b$)A张") == "CT 张"  # an escape pydicom's decoder left
    assert copied_text("PN", "Doe^J\u00e4n=\u5c71\u7530") == "Doe^J\u00e4n=\u5c71\u7530"
    ds = Dataset()
    ds.PatientID, ds.AccessionNumber = "P\x00", "A\x01"  # identifiers: refused at ingest
    ds.StudyDescription, ds.StudyDate = "S\x00D", "2020\x0101"
    assert clean_copied(ds) == ["StudyDate", "StudyDescription"]
    assert (ds.PatientID, ds.AccessionNumber) == ("P\x00", "A\x01")
    assert (ds.StudyDescription, ds.StudyDate) == ("SD", "")
