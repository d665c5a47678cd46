"""The one rule for source values copied into the DICOM results: each fits its VR in
UTF-8 bytes, cut on a character boundary, a Person Name group by group."""

from __future__ import annotations

import pytest
from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataset import Dataset

from radserve.models.dicom_text import cut_utf8
from radserve.report.shortened import (
    COPIED_KEYWORDS,
    COPIED_MODULES,
    CUT_VRS,
    MAX_BYTES,
    CopiedValueTooLongError,
    cut_copied,
    cut_encoded,
    required_type,
    reshaped_values,
    results_character_set,
    shortened_values,
)


def test_values_are_cut_to_their_vr_in_bytes_on_character_boundaries() -> None:
    ds = Dataset()
    ds.PatientName = "山田^太郎" * 10 + "=" + "やまだ^たろう" * 10  # ideographic=phonetic
    ds.PatientID = "ΑΒ" * 40  # LO: 160 bytes
    ds.AdmittingDiagnosesDescription = ["short", "é" * 40]  # LO, 1-n: each value counts
    ds.StudyID = "12345678901234567"  # SH: 17 bytes
    ds.SeriesDescription = "é" * 64  # not copied into the results: left alone
    cut = cut_copied(ds)
    assert sorted(cut) == ["AdmittingDiagnosesDescription", "PatientID", "PatientName", "StudyID"]
    assert cut_copied(ds) == []  # a second pass finds all fitting
    groups = str(ds.PatientName).split("=")
    assert len(groups) == 2 and all(len(g.encode()) <= 64 for g in groups)
    assert ("山田^太郎" * 10).startswith(groups[0]) and not groups[0].endswith("^")
    assert ds.PatientID == "ΑΒ" * 16 and len(ds.PatientID.encode()) == 64
    assert list(ds.AdmittingDiagnosesDescription) == ["short", "é" * 32]
    assert ds.StudyID == "1234567890123456"
    assert ds.SeriesDescription == "é" * 64 and "SeriesDescription" not in COPIED_KEYWORDS
    # all fit now; the name's eleven components are said apart (session 36)
    assert shortened_values(ds) == reshaped_values(ds) and len(reshaped_values(ds)) == 1


def test_the_report_names_each_attribute_and_its_size_never_the_value() -> None:
    ds = Dataset()
    ds.AccessionNumber = "ΑΡ" * 9  # 36 bytes, 18 characters
    ds.StudyDescription = "x" * 64  # fits exactly
    [(code, message)] = shortened_values(ds)
    assert code == "value_shortened" and "ΑΡ" not in message
    assert message.startswith("Accession Number (0008,0050) has a value of 36 bytes")


def test_values_inside_copied_sequences_are_cut_and_named_by_item() -> None:
    ds = Dataset()
    code = Dataset()
    code.CodeValue, code.CodingSchemeDesignator = "P1", "99X"
    code.CodeMeaning = "造影" * 30  # LO: 180 bytes
    ds.ProcedureCodeSequence = [code]
    inner = Dataset()
    inner.PatientID = "x" * 70  # two sequences deep
    ds.OtherPatientIDsSequence = [Dataset(), Dataset()]
    ds.OtherPatientIDsSequence[1].IssuerOfPatientIDQualifiersSequence = [inner]
    messages = [m for _, m in shortened_values(ds)]
    assert [m.split(" has ")[0] for m in messages] == [
        "Patient ID (0010,0020) in Issuer of Patient ID Qualifiers Sequence (0010,0024) "
        "item 1 in Other Patient IDs Sequence (0010,1002) item 2",
        "Code Meaning (0008,0104) in Procedure Code Sequence (0008,1032) item 1",
    ]
    assert not any("造影" in m or "xxx" in m for m in messages)
    assert cut_copied(ds) == [
        "OtherPatientIDsSequence[2].IssuerOfPatientIDQualifiersSequence[1].PatientID",
        "ProcedureCodeSequence[1].CodeMeaning",
    ]
    assert code.CodeMeaning == "造影" * 10 + "造" and inner.PatientID == "x" * 64
    assert shortened_values(ds) == []


def test_the_copied_attributes_are_highdicoms_copy_list() -> None:
    """The written-out list follows the installed highdicom (a new release may copy more)."""
    from highdicom._standard_utils import get_module_attribute_map

    modules = get_module_attribute_map()
    expected = tuple(
        dict.fromkeys(
            str(item["keyword"])
            for module in COPIED_MODULES
            for item in modules[module]
            if not item["path"]
        )
    )
    assert expected == COPIED_KEYWORDS


def test_the_required_attributes_are_highdicoms_module_tables() -> None:
    """The written-out Type 1/1C table (the attributes of the VRs written empty, the only
    ones asked about) follows the installed highdicom's PS3.3 tables."""
    from highdicom._standard_utils import get_module_attribute_map

    modules = get_module_attribute_map()
    asked = set(MAX_BYTES) - CUT_VRS
    expected = {
        (tuple(str(s) for s in item["path"]), str(item["keyword"])): str(item["type"])
        for module in COPIED_MODULES
        for item in modules[module]
        if item["type"] in ("1", "1C")
        and (tag := tag_for_keyword(str(item["keyword"]))) is not None
        and dictionary_VR(tag) in asked
    }
    assert len(expected) == 311
    assert {
        (within, keyword): required_type((tuple((seq, 0) for seq in within), keyword))
        for within, keyword in expected
    } == expected
    assert required_type(((), "PatientSex")) is None  # Type 2
    assert required_type(((("ReferencedPatientPhotoSequence", 0),), "StudyDate")) is None


def test_values_no_prefix_of_which_is_valid_are_written_empty_and_named() -> None:
    """A UID, date, time, number or age over its VR's limit cannot be cut (a prefix is
    another value or an invalid one): written empty (valid for Type 2 and 3), said in the
    report; CS too since session 19 (it was cut: "FEMALEFEMALEFEMA")."""
    ds = Dataset()
    ds.StudyDate = "202612031"  # DA: 9 bytes
    ds.StudyTime = "120000.000000  1"  # TM: 16 bytes (the pre-2019 limit)
    ds.PatientAge = "045YY"  # AS: 5 bytes
    ds.PatientWeight = "70.0000000000000001"  # DS: 19 bytes
    ds.PatientSex = "FEMALEFEMALEFEMALE"  # CS: 18 bytes, empty (a cut code is another)
    code = Dataset()
    code.CodeValue, code.CodingSchemeDesignator, code.CodeMeaning = "P1", "99X", "m"
    code.ContextUID = "1." + "2" * 70  # UI in an item: 72 bytes
    ds.ProcedureCodeSequence = [code]
    messages = {m.split(" has ")[0]: m for _, m in shortened_values(ds)}
    assert messages["Study Date (0008,0020)"].endswith(
        "the DICOM results carry it empty (DA allows 8 bytes, and a shorter DA would be "
        "another value) (the FHIR Bundle carries it whole)"
    )
    assert "carry it empty (CS allows 16 bytes" in messages["Patient's Sex (0010,0040)"]
    assert "Context UID (0008,0117) in Procedure Code Sequence (0008,1032) item 1" in messages
    assert sorted(cut_copied(ds)) == [
        "PatientAge",
        "PatientSex",
        "PatientWeight",
        "ProcedureCodeSequence[1].ContextUID",
        "StudyDate",
        "StudyTime",
    ]
    assert ds.StudyDate == "" and ds.StudyTime == "" and ds.PatientAge == ""
    assert ds.PatientWeight is None or ds.PatientWeight == ""
    assert ds.PatientSex == "" and code.ContextUID == ""
    assert shortened_values(ds) == []


def test_a_type1_uid_over_its_limit_is_refused_by_name() -> None:
    ref = Dataset()
    ref.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"
    ref.ReferencedSOPInstanceUID = "1." + "3" * 70  # 72 bytes; Type 1: never empty
    ds = Dataset()
    ds.ReferencedStudySequence = [ref]
    with pytest.raises(
        CopiedValueTooLongError,
        match=r"Referenced SOP Instance UID \(0008,1155\) in Referenced Study Sequence "
        r"\(0008,1110\) item 1 has a value of 72 bytes, over the 64 UI allows, and it is "
        r"Type 1",
    ):
        cut_copied(ds)


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("PatientSexNeutered", "UNALTERED^UNALTERED"),  # Enumerated: ALTERED, UNALTERED
        ("SmokingStatus", "UNKNOWN UNKNOWN UNKNOWN"),  # Enumerated: YES, NO, UNKNOWN
        ("PatientIdentityRemoved", "YES" * 6),  # Enumerated: YES, NO
    ],
)
def test_a_code_string_over_its_limit_is_written_empty_never_cut(keyword: str, value: str) -> None:
    """A cut CS left a value outside the attribute's Enumerated Values (703b666 cut
    'UNALTERED^UNALTERED' to 'UNALTERED^UNALTE'); no prefix of a code is the code."""
    ds = Dataset()
    setattr(ds, keyword, value)
    [(_, message)] = shortened_values(ds)
    assert "carry it empty (CS allows 16 bytes" in message
    assert cut_copied(ds) == [keyword] and ds[keyword].value in ("", None)


def test_an_ae_title_over_its_limit_is_written_empty_never_cut() -> None:
    """A cut AE title named another AE (it was cut: 'PACS_ARCHIVE_MAIN1' to
    'PACS_ARCHIVE_MAI', a peer that may exist): written empty with the warning, as CS."""
    series = Dataset()
    series.SeriesInstanceUID = "1.2.3.4"
    series.RetrieveAETitle = "PACS_ARCHIVE_MAIN1"  # AE: 18 bytes; Type 3 here
    photo = Dataset()
    photo.StudyInstanceUID = "1.2.3"
    photo.ReferencedSeriesSequence = [series]
    ds = Dataset()
    ds.ReferencedPatientPhotoSequence = [photo]
    [(_, message)] = shortened_values(ds)
    assert message.startswith(
        "Retrieve AE Title (0008,0054) in Referenced Series Sequence (0008,1115) item 1 "
        "in Referenced Patient Photo Sequence (0010,1100) item 1 has a value of 18 bytes"
    )
    assert "carry it empty (AE allows 16 bytes, and a shorter AE would be another" in message
    assert cut_copied(ds) == [
        "ReferencedPatientPhotoSequence[1].ReferencedSeriesSequence[1].RetrieveAETitle"
    ]
    assert series.RetrieveAETitle in ("", None)
    assert shortened_values(ds) == []


def test_a_required_code_string_in_an_item_is_refused_with_its_type() -> None:
    """Type 1 and 1C come from highdicom's copy of the PS3.3 module tables, by the
    attribute's place (Universal Entity ID Type is 1C in Issuer of Patient ID Qualifiers
    Sequence items), not from a hand list of keywords."""
    qualifiers = Dataset()
    qualifiers.UniversalEntityID = "urn:oid:1.2.3"
    qualifiers.UniversalEntityIDType = "ISO-ISO-ISO-ISO-ISO"  # 19 bytes
    ds = Dataset()
    ds.IssuerOfPatientIDQualifiersSequence = [qualifiers]
    with pytest.raises(CopiedValueTooLongError, match=r"\(0040,0033\) in .* is Type 1C"):
        cut_copied(ds)


@pytest.mark.parametrize(
    ("charset", "codec", "name"),
    [
        ("ISO_IR 100", "latin-1", "é" * 70),  # 70 bytes Latin-1, 140 as UTF-8
        ("ISO_IR 100", "latin-1", "Ä" * 64),  # fits Latin-1: not cut (UTF-8 said 128)
        ("GB18030", "gb18030", "王" * 40),  # 80 bytes GB18030, 120 as UTF-8
        ("GB18030", "gb18030", "ß" * 20),  # 80 bytes GB18030 (4 each), 40 as UTF-8
    ],
)
def test_values_are_counted_in_the_declared_character_set(
    charset: str, codec: str, name: str
) -> None:
    """Before session 19 every value was counted as UTF-8: a Latin-1 name of 64 accented
    letters was cut to 32, and 20 'ß' in GB18030 (80 bytes) were copied whole."""
    ds = Dataset()
    ds.SpecificCharacterSet = charset
    ds.PatientName = name
    ds.StudyDescription = name
    expected = next(name[:n] for n in range(len(name), -1, -1) if len(name[:n].encode(codec)) <= 64)
    cut = cut_copied(ds)
    assert (cut != []) == (len(name.encode(codec)) > 64)
    assert str(ds.PatientName) == expected and ds.StudyDescription == expected


def test_values_are_counted_in_the_character_set_the_object_is_written_in() -> None:
    """A Latin-1 study whose results need UTF-8 (a model label outside Latin-1): its
    copied values are counted as UTF-8, the bytes they will be written in (64 'é' fit
    ISO_IR 100 and are 128 bytes in ISO_IR 192)."""
    from radserve.report.dicom import common
    from radserve.report.shortened import output_character_set

    source = Dataset()
    source.SpecificCharacterSet = "ISO_IR 100"
    source.PatientName = "Müller^" + "é" * 57  # 64 bytes in Latin-1
    source.StudyDescription = "é" * 64
    written_in = output_character_set(source, ["肝臓"])
    assert written_in == "ISO_IR 192"
    (shielded,), name = common.shield_patient_name([source], written_in)
    assert shielded.StudyDescription == "é" * 32
    result = Dataset()
    common.restore_patient_name(result, name, written_in)
    assert len(str(result.PatientName).encode()) <= 64
    assert str(result.PatientName) == "Müller^" + "é" * 28  # 8 + 56 bytes
    (kept,), name = common.shield_patient_name([source], "ISO_IR 100")
    assert kept.StudyDescription == "é" * 64 and str(name) == str(source.PatientName)


def test_a_utf8_cut_is_the_one_of_dicom_text() -> None:
    """With no declared character set the cut is dicom_text.cut_utf8 (radserve's own
    text is cut by it too): the longest prefix of whole characters within the bytes."""
    text = "aé山😀" * 5 + "^Ω"
    for max_bytes in range(len(text.encode()) + 2):
        longest = next(
            text[:n] for n in range(len(text), -1, -1) if len(text[:n].encode()) <= max_bytes
        )
        assert cut_encoded(text, max_bytes) == cut_utf8(text, max_bytes) == longest


def test_the_warnings_count_in_the_character_set_the_results_are_written_in() -> None:
    """Before session 20 the report's warnings counted in the study's declared set while
    the SEG and SR switched to UTF-8 for radserve's own text (here a pipeline name
    outside Latin-1): 64 'é' (64 bytes in ISO_IR 100, 128 in UTF-8) were cut to 32 in
    the results without a warning."""
    from tests.unit.test_report_json import _report

    from radserve.report import PipelineInfo

    source = Dataset()
    source.SpecificCharacterSet = "ISO_IR 100"
    source.StudyDescription = "é" * 64
    report = _report()
    assert results_character_set(source, report) == "ISO_IR 100"
    assert shortened_values(source, results_character_set(source, report)) == []
    utf8 = report.model_copy(update={"pipeline": PipelineInfo(name="腹部", version="1.0")})
    assert results_character_set(source, utf8) == "ISO_IR 192"
    [(_, message)] = shortened_values(source, results_character_set(source, utf8))
    assert message.startswith("Study Description (0008,1030) has a value of 128 bytes")
    assert shortened_values(source) == []  # counted as declared, as before
