"""The one rule for source values copied into the DICOM results: each fits its VR in
UTF-8 bytes, cut on a character boundary, a Person Name group by group."""

from __future__ import annotations

from pydicom.dataset import Dataset

from radserve.report.shortened import COPIED_KEYWORDS, COPIED_MODULES, cut_copied, shortened_values


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
    assert shortened_values(ds) == []  # all fit now


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
