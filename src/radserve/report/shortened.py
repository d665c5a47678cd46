"""Source values the DICOM results carry shortened: the one rule, and the report warning
that names each attribute cut and how long it was, never the value.

highdicom copies the Patient, General Study, Patient Study and Clinical Trial attributes
of a source header into every SEG, SR and Secondary Capture. A source may hold any
length there (a 65,534-byte Patient's Name arrived through every door; a 60-character
CJK name is 180 bytes), and dciodvfy counts a value's encoded bytes against its VR's
limit, so each such text value is cut to fit, counted in the bytes of the character
set the object is written in (the study's declared one, or UTF-8 where radserve's own
text does not fit it or none is declared; pydicom's encoder), on a
character boundary, and a Person Name group by group (the ``=`` separators stay);
inside the items of the sequences copied (a Procedure Code Sequence's Code Meaning, an
Other Patient IDs Sequence's Patient ID) by the same rule. A value of a VR no prefix of
which is valid (UI, DA, TM, DT, DS, IS, AS; CS and AE: a prefix of a code is another
code, of an AE title another AE's name) is written empty instead (valid for Type 2 and
3; a Type 1 or 1C one, by the PS3.3 module tables (written out here from highdicom's
copy), is refused by name) (before session 18 only PN, LO, SH, ST and LT were looked at:
a 5-byte Patient's Age was copied whole). A reader comparing the results with the
PACS's images must be told: the report carries one ``value_shortened`` warning per
attribute (JSON, and a Quality Issue in the SR). The FHIR Bundle keeps
values whole (FHIR has no length limit).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from types import EllipsisType

import pydicom
from pydicom.charset import (
    CODES_TO_ENCODINGS,
    convert_encodings,
    decode_bytes,
    encode_string,
    python_encoding,
)
from pydicom.config import IGNORE
from pydicom.datadict import dictionary_description, dictionary_VR, tag_for_keyword
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.tag import Tag
from pydicom.valuerep import DA, TEXT_VR_DELIMS, TM, PersonName

from radserve.errors import StudyError
from radserve.ingest.charset import LATIN1, TEXT_VRS, UTF8, undeclared_character_set
from radserve.models.dicom_text import LO_MAX_BYTES, SH_MAX_BYTES, cut_utf8, fit
from radserve.report.schema import Report

logger = logging.getLogger(__name__)

VALUE_SHORTENED = "value_shortened"  # the report warning's code
# PS3.5 Table 6.2-1, as bytes (PN: per component group; the limits in characters of the
# ASCII-only VRs are bytes; TM: 14 since the 2019 editions, which dropped the old 16)
MAX_BYTES = {
    "AE": 16,
    "CS": 16,
    "PN": 64,
    "LO": LO_MAX_BYTES,
    "SH": SH_MAX_BYTES,
    "ST": 1024,
    "LT": 10240,
    "AS": 4,
    "DA": 8,
    "DS": 16,
    "DT": 26,
    "IS": 12,
    "TM": 14,
    "UI": 64,
}
# text VRs whose prefix is still a valid value: cut; the others (a UID, a date, a time, a
# number, an age, a code string) would become another value or an invalid one: written
# empty (valid for Type 2 and 3), and refused by name where the attribute is Type 1 or 1C.
# CS is not cut since session 19: a prefix of a code is another code, and for the
# attributes with Enumerated Values (Patient's Sex Neutered, Smoking Status, Patient
# Identity Removed, ...) no value over 16 bytes has a valid prefix. AE neither since
# session 19: a prefix of an AE title names another AE (a retrieve or station title in a
# copied item would send a reader to the wrong peer).
CUT_VRS = frozenset({"PN", "LO", "SH", "ST", "LT"})


class CopiedValueTooLongError(StudyError):
    """A Type 1 source value copied into the DICOM results is over its VR's limit, and
    neither a cut nor an empty value would be valid: the source's fault, whatever model
    version ran it (was ``report_failed``, which reads as radserve's own failure)."""

    code = "source_value_too_long"


COPIED_MODULES = (  # what highdicom's copy_patient_and_study_information copies
    "patient",
    "clinical-trial-subject",
    "general-study",
    "patient-study",
    "clinical-trial-study",
)

# highdicom 0.28's copy list (its module attribute map, top-level attributes of the modules
# above): written out so the run path needs no highdicom and no private module of it;
# tests/unit/test_report_shortened.py checks it against the installed highdicom.
COPIED_KEYWORDS: tuple[str, ...] = (
    "ReferencedPatientSequence",
    "PatientName",
    "PatientID",
    "IssuerOfPatientID",
    "TypeOfPatientID",
    "IssuerOfPatientIDQualifiersSequence",
    "SourcePatientGroupIdentificationSequence",
    "GroupOfPatientsIdentificationSequence",
    "PatientBirthDate",
    "PatientBirthTime",
    "PatientBirthDateInAlternativeCalendar",
    "PatientDeathDateInAlternativeCalendar",
    "PatientAlternativeCalendar",
    "PatientSex",
    "QualityControlSubject",
    "StrainDescription",
    "StrainNomenclature",
    "StrainStockSequence",
    "StrainAdditionalInformation",
    "StrainCodeSequence",
    "GeneticModificationsSequence",
    "OtherPatientNames",
    "OtherPatientIDsSequence",
    "ReferencedPatientPhotoSequence",
    "EthnicGroupCodeSequence",
    "PatientSpeciesDescription",
    "PatientSpeciesCodeSequence",
    "PatientBreedDescription",
    "PatientBreedCodeSequence",
    "BreedRegistrationSequence",
    "ResponsiblePerson",
    "ResponsiblePersonRole",
    "ResponsibleOrganization",
    "PatientComments",
    "PatientIdentityRemoved",
    "DeidentificationMethod",
    "DeidentificationMethodCodeSequence",
    "ClinicalTrialSponsorName",
    "ClinicalTrialProtocolID",
    "ClinicalTrialProtocolName",
    "IssuerOfClinicalTrialProtocolID",
    "OtherClinicalTrialProtocolIDsSequence",
    "ClinicalTrialSiteID",
    "ClinicalTrialSiteName",
    "IssuerOfClinicalTrialSiteID",
    "ClinicalTrialSubjectID",
    "IssuerOfClinicalTrialSubjectID",
    "ClinicalTrialSubjectReadingID",
    "IssuerOfClinicalTrialSubjectReadingID",
    "ClinicalTrialProtocolEthicsCommitteeName",
    "ClinicalTrialProtocolEthicsCommitteeApprovalNumber",
    "StudyDate",
    "StudyTime",
    "AccessionNumber",
    "IssuerOfAccessionNumberSequence",
    "ReferringPhysicianName",
    "ReferringPhysicianIdentificationSequence",
    "ConsultingPhysicianName",
    "ConsultingPhysicianIdentificationSequence",
    "StudyDescription",
    "ProcedureCodeSequence",
    "PhysiciansOfRecord",
    "PhysiciansOfRecordIdentificationSequence",
    "NameOfPhysiciansReadingStudy",
    "PhysiciansReadingStudyIdentificationSequence",
    "ReferencedStudySequence",
    "StudyInstanceUID",
    "StudyID",
    "RequestingService",
    "RequestingServiceCodeSequence",
    "ReasonForPerformedProcedureCodeSequence",
    "AdmittingDiagnosesDescription",
    "AdmittingDiagnosesCodeSequence",
    "PatientAge",
    "PatientSize",
    "PatientSizeCodeSequence",
    "PatientBodyMassIndex",
    "MeasuredAPDimension",
    "MeasuredLateralDimension",
    "PatientWeight",
    "MedicalAlerts",
    "Allergies",
    "Occupation",
    "SmokingStatus",
    "AdditionalPatientHistory",
    "PregnancyStatus",
    "LastMenstrualDate",
    "PatientSexNeutered",
    "ReasonForVisit",
    "ReasonForVisitCodeSequence",
    "AdmissionID",
    "IssuerOfAdmissionIDSequence",
    "ServiceEpisodeID",
    "ServiceEpisodeDescription",
    "IssuerOfServiceEpisodeIDSequence",
    "PatientState",
    "ClinicalTrialTimePointID",
    "ClinicalTrialTimePointDescription",
    "LongitudinalTemporalOffsetFromEvent",
    "LongitudinalTemporalEventType",
    "ClinicalTrialTimePointTypeCodeSequence",
    "IssuerOfClinicalTrialTimePointID",
    "ConsentForClinicalTrialUseSequence",
)


def encodings_of(dataset: Dataset | None) -> list[str] | None:
    """The Python encodings of ``dataset``'s Specific Character Set, in which its values
    are written and counted (None: none declared, counted as UTF-8 as before)."""
    return encodings_for(dataset.get("SpecificCharacterSet") if dataset is not None else None)


def encodings_for(declared: str | Sequence[str] | None) -> list[str] | None:
    """The Python encodings of a Specific Character Set value (None: UTF-8 is counted)."""
    if not declared:
        return None
    try:
        return convert_encodings(declared)
    except (LookupError, ValueError):  # a term pydicom does not know: the object is UTF-8
        return None


def encoded_size(text: str, encodings: Sequence[str] | None = None) -> int:
    """Bytes of ``text`` as written in ``encodings`` (pydicom's encoder: ISO 2022
    escapes included); UTF-8 where none is given or the text does not fit the repertoire
    (the writer then switches the object to UTF-8)."""
    if encodings is None or text.isascii():
        return len(text.encode())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # pydicom warns, then writes replacement bytes
            return len(encode_string(text, list(encodings)))
    except (UnicodeError, LookupError, ValueError, UserWarning):
        return len(text.encode())


def cut_encoded(text: str, max_bytes: int, encodings: Sequence[str] | None = None) -> str:
    """The longest prefix of ``text`` (whole characters) of at most ``max_bytes`` bytes in
    ``encodings`` (None: UTF-8, :func:`radserve.models.dicom_text.cut_utf8`)."""
    if encodings is None:
        return cut_utf8(text, max_bytes)
    if encoded_size(text, encodings) <= max_bytes:
        return text
    low, high = 0, min(len(text), max_bytes)  # every character is at least one byte
    while low < high:
        middle = (low + high + 1) // 2
        if encoded_size(text[:middle], encodings) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def fit_value(vr: str, text: str, encodings: Sequence[str] | None = None) -> str:
    """One text value of ``vr`` cut to its limit in ``encodings``; a Person Name group by
    group."""
    limit = MAX_BYTES[vr]
    if vr != "PN":
        return cut_encoded(text, limit, encodings)
    return "=".join(
        g if encoded_size(g, encodings) <= limit else cut_encoded(g, limit, encodings).rstrip("^ ")
        for g in text.split("=")
    )


def value_bytes(vr: str, text: str, encodings: Sequence[str] | None = None) -> int:
    """What is measured against ``vr``'s limit: the value's bytes in ``encodings`` (the
    study's declared Specific Character Set; before session 19 always UTF-8, so a Latin-1
    name of 64 accented letters was cut to 32 and a GB18030 one of 40 'ß' (80 bytes) was
    copied whole), or for a Person Name its longest component group's."""
    return max(encoded_size(g, encodings) for g in (text.split("=") if vr == "PN" else [text]))


# The Type 1 and 1C attributes of the copied modules and of their sequences' items (PS3.3
# C.7.1.1, C.7.1.3, C.7.2.1, C.7.2.2, C.7.2.3 and the macros they include) whose VR is one
# that is written empty rather than cut: the only ones :func:`required_type` is asked
# about. Written out from highdicom 0.28's copy of the PS3.3 tables because highdicom
# reads those only through a private module (highdicom._standard_utils) and pydicom's
# dictionary has no attribute types; tests/unit/test_report_shortened.py checks this
# table against the installed highdicom. Keyed by the sequences an attribute is inside
# ("A.B": in an item of B in an item of A; "": top level).
# The Code Sequence Macro's (Table 8.8-1) such attributes, each 1C, in the items of
# these code sequences and of their items' Equivalent Code Sequence:
_CODE_ITEM_1C = (
    "ContextGroupExtensionCreatorUID",
    "ContextGroupLocalVersion",
    "ContextGroupVersion",
    "MappingResource",
)
_CODE_SEQUENCES = (
    "AdmittingDiagnosesCodeSequence",
    "BreedRegistrationSequence.BreedRegistryCodeSequence",
    "ClinicalTrialTimePointTypeCodeSequence",
    "ConsultingPhysicianIdentificationSequence.InstitutionCodeSequence",
    "ConsultingPhysicianIdentificationSequence.InstitutionalDepartmentTypeCodeSequence",
    "ConsultingPhysicianIdentificationSequence.PersonIdentificationCodeSequence",
    "DeidentificationMethodCodeSequence",
    "EthnicGroupCodeSequence",
    "GeneticModificationsSequence.GeneticModificationsCodeSequence",
    "GroupOfPatientsIdentificationSequence.IssuerOfPatientIDQualifiersSequence.AssigningAgencyOrDepartmentCodeSequence",
    "GroupOfPatientsIdentificationSequence.IssuerOfPatientIDQualifiersSequence.AssigningJurisdictionCodeSequence",
    "IssuerOfPatientIDQualifiersSequence.AssigningAgencyOrDepartmentCodeSequence",
    "IssuerOfPatientIDQualifiersSequence.AssigningJurisdictionCodeSequence",
    "OtherPatientIDsSequence.IssuerOfPatientIDQualifiersSequence.AssigningAgencyOrDepartmentCodeSequence",
    "OtherPatientIDsSequence.IssuerOfPatientIDQualifiersSequence.AssigningJurisdictionCodeSequence",
    "PatientBreedCodeSequence",
    "PatientSizeCodeSequence",
    "PatientSpeciesCodeSequence",
    "PhysiciansOfRecordIdentificationSequence.InstitutionCodeSequence",
    "PhysiciansOfRecordIdentificationSequence.InstitutionalDepartmentTypeCodeSequence",
    "PhysiciansOfRecordIdentificationSequence.PersonIdentificationCodeSequence",
    "PhysiciansReadingStudyIdentificationSequence.InstitutionCodeSequence",
    "PhysiciansReadingStudyIdentificationSequence.InstitutionalDepartmentTypeCodeSequence",
    "PhysiciansReadingStudyIdentificationSequence.PersonIdentificationCodeSequence",
    "ProcedureCodeSequence",
    "ReasonForPerformedProcedureCodeSequence",
    "ReasonForVisitCodeSequence",
    "ReferringPhysicianIdentificationSequence.InstitutionCodeSequence",
    "ReferringPhysicianIdentificationSequence.InstitutionalDepartmentTypeCodeSequence",
    "ReferringPhysicianIdentificationSequence.PersonIdentificationCodeSequence",
    "RequestingServiceCodeSequence",
    "SourcePatientGroupIdentificationSequence.IssuerOfPatientIDQualifiersSequence.AssigningAgencyOrDepartmentCodeSequence",
    "SourcePatientGroupIdentificationSequence.IssuerOfPatientIDQualifiersSequence.AssigningJurisdictionCodeSequence",
    "StrainCodeSequence",
    "StrainStockSequence.StrainSourceRegistryCodeSequence",
)
_REQUIRED = {  # the others: (sequences, keyword) -> type
    ("", "LongitudinalTemporalEventType"): "1C",
    ("", "PatientAlternativeCalendar"): "1C",
    ("", "ResponsiblePersonRole"): "1C",
    ("", "StudyInstanceUID"): "1",
    ("ConsentForClinicalTrialUseSequence", "ConsentForDistributionFlag"): "1",
    ("ConsentForClinicalTrialUseSequence", "DistributionType"): "1C",
    (
        "GroupOfPatientsIdentificationSequence.IssuerOfPatientIDQualifiersSequence",
        "UniversalEntityIDType",
    ): "1C",
    (
        "GroupOfPatientsIdentificationSequence.IssuerOfPatientIDQualifiersSequence.AssigningFacilitySequence",
        "UniversalEntityIDType",
    ): "1C",
    ("IssuerOfAccessionNumberSequence", "UniversalEntityIDType"): "1C",
    ("IssuerOfAdmissionIDSequence", "UniversalEntityIDType"): "1C",
    ("IssuerOfPatientIDQualifiersSequence", "UniversalEntityIDType"): "1C",
    (
        "IssuerOfPatientIDQualifiersSequence.AssigningFacilitySequence",
        "UniversalEntityIDType",
    ): "1C",
    ("IssuerOfServiceEpisodeIDSequence", "UniversalEntityIDType"): "1C",
    ("OtherPatientIDsSequence", "TypeOfPatientID"): "1",
    ("OtherPatientIDsSequence.IssuerOfPatientIDQualifiersSequence", "UniversalEntityIDType"): "1C",
    (
        "OtherPatientIDsSequence.IssuerOfPatientIDQualifiersSequence.AssigningFacilitySequence",
        "UniversalEntityIDType",
    ): "1C",
    ("ReferencedPatientPhotoSequence", "SeriesInstanceUID"): "1C",
    ("ReferencedPatientPhotoSequence", "StudyInstanceUID"): "1C",
    ("ReferencedPatientPhotoSequence", "TypeOfInstances"): "1",
    ("ReferencedPatientPhotoSequence.DICOMMediaRetrievalSequence", "StorageMediaFileSetUID"): "1",
    ("ReferencedPatientPhotoSequence.DICOMRetrievalSequence", "RetrieveAETitle"): "1",
    ("ReferencedPatientPhotoSequence.ReferencedSOPSequence", "ReferencedFrameNumber"): "1C",
    ("ReferencedPatientPhotoSequence.ReferencedSOPSequence", "ReferencedSOPClassUID"): "1",
    ("ReferencedPatientPhotoSequence.ReferencedSOPSequence", "ReferencedSOPInstanceUID"): "1",
    ("ReferencedPatientPhotoSequence.XDSRetrievalSequence", "RepositoryUniqueID"): "1",
    ("ReferencedPatientSequence", "ReferencedSOPClassUID"): "1",
    ("ReferencedPatientSequence", "ReferencedSOPInstanceUID"): "1",
    ("ReferencedStudySequence", "ReferencedSOPClassUID"): "1",
    ("ReferencedStudySequence", "ReferencedSOPInstanceUID"): "1",
    (
        "SourcePatientGroupIdentificationSequence.IssuerOfPatientIDQualifiersSequence",
        "UniversalEntityIDType",
    ): "1C",
    (
        "SourcePatientGroupIdentificationSequence.IssuerOfPatientIDQualifiersSequence.AssigningFacilitySequence",
        "UniversalEntityIDType",
    ): "1C",
}


@cache
def _required_in_copied_modules() -> dict[tuple[tuple[str, ...], str], str]:
    """(sequence keywords, keyword) -> "1" or "1C", from the tables above."""
    required = {
        (tuple(filter(None, within.split("."))), kw): t for (within, kw), t in _REQUIRED.items()
    }
    for sequence in _CODE_SEQUENCES:
        path = tuple(sequence.split("."))
        for within in (path, (*path, "EquivalentCodeSequence")):
            required.update({(within, keyword): "1C" for keyword in _CODE_ITEM_1C})
    return required


def required_type(path: Path) -> str | None:
    """``"1"`` or ``"1C"`` where the attribute at ``path`` may not be empty when present,
    else None."""
    within, keyword = path
    return _required_in_copied_modules().get((tuple(seq for seq, _ in within), keyword))


def _values(value: object) -> list[str]:
    if value is None or value == "":
        return []
    return [str(v) for v in value] if isinstance(value, MultiValue | list) else [str(value)]


# where a value is: (sequence keyword, item index) for each sequence it is inside, and
# the attribute's keyword (a nested attribute of no keyword: its tag as text)
Path = tuple[tuple[tuple[str, int], ...], str]


def _copied_in(
    dataset: Dataset, keywords: Iterable[str] | None, within: tuple[tuple[str, int], ...]
) -> Iterator[tuple[Path, DataElement]]:
    """Each copied attribute of ``dataset`` other than a sequence, and where it is
    (``keywords``: only those, at the top; inside a sequence item, every attribute:
    highdicom copies sequences whole)."""
    if keywords is None:
        elements = list(dataset)
    else:
        tags = (tag_for_keyword(k) for k in keywords)
        elements = [dataset[tag] for tag in tags if tag is not None and tag in dataset]
    for element in elements:
        name = element.keyword or _tag_of(element.tag)
        if element.VR == "SQ":
            for index, item in enumerate(element.value or ()):
                yield from _copied_in(item, None, (*within, (name, index)))
            continue
        yield (within, name), element


def _over_long_in(
    dataset: Dataset,
    keywords: Iterable[str] | None,
    within: tuple[tuple[str, int], ...],
    encodings: Sequence[str] | None,
) -> Iterator[tuple[Path, str, int, DataElement]]:
    """What :func:`over_long` yields for ``dataset`` (``keywords``: as
    :func:`_copied_in`)."""
    for path, element in _copied_in(dataset, keywords, within):
        if element.VR not in MAX_BYTES:
            continue
        sizes = [value_bytes(element.VR, v, encodings) for v in _values(element.value)]
        if sizes and max(sizes) > MAX_BYTES[element.VR]:
            yield path, element.VR, max(sizes), element


def over_long(dataset: Dataset) -> Iterator[tuple[Path, str, int]]:
    """(where, VR, bytes) of each copied attribute of ``dataset`` whose longest value is
    over its VR's limit, inside the copied sequences' items too (before session 18 only
    the top-level attributes were looked at: a 65-byte CodeMeaning in a Procedure Code
    Sequence item was copied whole)."""
    for path, vr, size, _ in _over_long_in(dataset, COPIED_KEYWORDS, (), encodings_of(dataset)):
        yield path, vr, size


# --- characters a copied value may not hold ---------------------------------------------------
# Control characters (Unicode's Cc: C0, DEL, C1) are valid in no copied value but the
# format effectors of Short, Long and Unlimited Text (PS3.5 6.1.3: TAB, LF, FF, CR); an
# ESC only opens an ISO 2022 escape sequence, and pydicom writes those itself from the
# decoded text. A source's bytes its character set does not define are read as such
# characters (C1 where a UTF-8 mislabel is read as Latin-1, radserve.ingest.charset) or as
# pydicom's replacement character U+FFFD: both are dropped, never shown. Before session
# 42 a Study Description "SD<NUL><SOH><ESC>[2J<CR><LF>..." and a Referring Physician's
# Name holding NUL, DEL and NEL were copied as they came (dciodvfy: "Character invalid
# for this VR"), and under ISO_IR 100 bytes 0x80 and 0x81 ("invalid for character
# repertoire").
MULTI_LINE_VRS = frozenset({"ST", "LT", "UT"})
_NOT_TEXT = {c: None for c in (*range(0x20), *range(0x7F, 0xA0), 0xFFFD)}
_NOT_MULTI_LINE_TEXT = {c: None for c in _NOT_TEXT if chr(c) not in "\t\n\f\r"}
# an escape sequence pydicom's decoder left in the text (GB 2312's ESC $ ) A, pydicom 3.0:
# radserve.ingest.person_name), dropped whole rather than leave "$)A" behind
_LEFT_ESCAPES = tuple(code.decode("latin_1") for code in CODES_TO_ENCODINGS)
# The patient and request identifiers are not cleaned: one holding a control character
# is refused at ingest (radserve.ingest.validate), and a changed identifier would name
# another patient or order in the PACS.
IDENTIFIERS = frozenset(
    {"PatientName", "PatientID", "IssuerOfPatientID", "PatientBirthDate", "AccessionNumber"}
)
_STRING_VRS = TEXT_VRS | MAX_BYTES.keys()


def copied_text(vr: str, text: str) -> str:
    """``text`` as a copied value of ``vr`` may hold it: without the control characters
    ``vr`` does not admit, escape sequences a decoder left in, or replacement characters."""
    if "\x1b" in text:
        for code in _LEFT_ESCAPES:
            text = text.replace(code, "")
    return text.translate(_NOT_MULTI_LINE_TEXT if vr in MULTI_LINE_VRS else _NOT_TEXT)


def _not_admitted_in(dataset: Dataset) -> Iterator[tuple[Path, DataElement]]:
    """Each copied attribute of ``dataset`` (identifiers aside) holding a character its VR
    does not admit (:func:`copied_text`), in the copied sequences' items too."""
    for path, element in _copied_in(dataset, COPIED_KEYWORDS, ()):
        if element.VR not in _STRING_VRS or (not path[0] and path[1] in IDENTIFIERS):
            continue
        if any(copied_text(element.VR, v) != v for v in _values(element.value)):
            yield path, element


def clean_copied(dataset: Dataset) -> list[str]:
    """Drop, in place, what :func:`copied_text` drops from each copied value of
    ``dataset`` but an identifier's; where (:func:`path_text`). A value of a VR other
    than text (a code, date, number, UID) is another value without the character: it is
    written empty, as an over-long one is; a Type 1 or 1C one is left as it came."""
    changed = []
    for path, element in list(_not_admitted_in(dataset)):
        if element.VR not in TEXT_VRS:
            if required_type(path) is not None:
                logger.warning("source %s holds control characters; left", path_text(path))
                continue
            element.value = ""
        else:
            values = [copied_text(element.VR, v) for v in _values(element.value)]
            element.value = values if len(values) > 1 else values[0]
        changed.append(path_text(path))
    return changed


def cleaned_values(dataset: Dataset) -> list[tuple[str, str]]:
    """(code, message) of each copied value :func:`clean_copied` changes (one of the
    attributes :func:`emptied_values` names aside: said there)."""
    emptied = set(emptied_values(dataset))
    return [
        (
            VALUE_SHORTENED,
            f"{_where(path)} holds control characters or bytes its character set does not "
            "define: the DICOM results carry it "
            + ("without them" if element.VR in TEXT_VRS else "empty"),
        )
        for path, element in _not_admitted_in(dataset)
        if (path[0] or path[1] not in emptied)
        and (element.VR in TEXT_VRS or required_type(path) is None)
    ]


def _copied_texts(dataset: Dataset) -> Iterator[tuple[str, str]]:
    """(VR, value) of each copied text value of ``dataset``, as it will be written."""
    for path, element in _copied_in(dataset, COPIED_KEYWORDS, ()):
        if element.VR not in TEXT_VRS:
            continue
        identifier = not path[0] and path[1] in IDENTIFIERS
        for value in _values(element.value):
            yield element.VR, value if identifier else copied_text(element.VR, value)


# --- character set -------------------------------------------------------------------------------
# ISO 2022 code extensions of multi-byte characters (PS3.3 Table C.12-4): pydicom 3 writes
# them right only after a first value (the G0 set; empty: ISO 2022 IR 6). A source's
# single-valued "ISO 2022 IR 87" was copied as it came, and pydicom wrote each "ESC ( B"
# of its Patient's Name as "ESC $ B", so "^" and "=" became Kanji bytes (session 42).
MULTI_BYTE_EXTENSIONS = frozenset(
    {"ISO 2022 IR 87", "ISO 2022 IR 159", "ISO 2022 IR 149", "ISO 2022 IR 58"}
)


# pydicom 3 writes GB 2312 without its escape sequences in every form of the set, and its
# Person Name writer does so where the round trip of :func:`round_trips` does not show it
# (a failure notice's Patient's Name, the only text copied, read back as Latin-1)
NOT_WRITTEN_FAITHFULLY = frozenset({"ISO 2022 IR 58"})


def written_form(terms: Sequence[str]) -> str | list[str]:
    """A Specific Character Set as a written object declares it: a multi-byte code
    extension as value 1 gets an empty value 1 before it."""
    if terms[0] in MULTI_BYTE_EXTENSIONS:
        terms = ["", *terms]
    return list(terms) if len(terms) > 1 else terms[0]


def round_trips(value: str | list[str], texts: Iterable[tuple[str, str]]) -> bool:
    """Whether pydicom writes each (VR, text) of ``texts`` in the Specific Character Set
    ``value`` so that it reads back the same (pydicom 3 does not for every form: GB 2312
    (ISO 2022 IR 58) is written without its escape sequences, so read back as Latin-1)."""
    try:
        encodings = convert_encodings(value)
    except (LookupError, ValueError):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydicom warns, then writes replacement bytes
        for vr, text in texts:  # ASCII too: pydicom warns for any under "ISO 2022 IR 87"
            try:
                if vr == "PN":  # not validated: a value over its length is cut later
                    raw = PersonName(text, validation_mode=IGNORE).encode(encodings)
                    back = str(PersonName(raw, encodings, validation_mode=IGNORE))
                else:
                    back = decode_bytes(encode_string(text, encodings), encodings, TEXT_VR_DELIMS)
            except (UnicodeError, LookupError, ValueError, UserWarning):
                return False
            if back != text:
                return False
    return True


def output_character_set(source: Dataset, texts: Iterable[str]) -> str | list[str] | None:
    """Specific Character Set of a new object: the source's, unless our own text needs more.

    Patient and study attributes are copied from the source, so keeping its character set
    keeps them byte-identical and readable by whatever sent them. Our own text (labels,
    model names) is usually ASCII; if any of it cannot be written in the source's
    repertoire, the object is written in UTF-8 (ISO_IR 192) instead, and pydicom re-encodes
    the copied names from their decoded form. ``None`` means the default repertoire.

    A source that declares no character set but holds non-ASCII text gets one declared:
    :func:`read_headers` sets what its bytes are (:mod:`radserve.ingest.charset`); a
    header read elsewhere had them decoded as Latin-1, so ISO_IR 100 keeps them. A term
    pydicom does not know (it reads the text in the default repertoire) is not copied:
    the object is UTF-8. The source's set is declared in the form pydicom writes right
    (:func:`written_form`), and only where pydicom writes our text and the copied values
    in it so that they read back the same (:func:`round_trips`); else UTF-8.
    """
    value = source.get("SpecificCharacterSet")
    if isinstance(value, list | pydicom.multival.MultiValue):
        terms = [str(v) for v in value]
    else:
        terms = [str(value)] if value else []
    texts = list(texts)
    if not any(terms):
        if undeclared_character_set(source) is None:  # its text is ASCII
            return None if all(t.isascii() for t in texts) else UTF8
        # pydicom read the undeclared text as Latin-1: so written, the bytes stay the same
        return LATIN1 if all(_encodable(t, ["latin_1"]) for t in texts) else UTF8
    if any(term and term not in python_encoding for term in terms):
        logger.info("output character set: UTF-8 (the source's Specific Character Set is unknown)")
        return UTF8
    try:
        encodings = convert_encodings(terms)
    except Exception:  # a term pydicom refuses: write what we can vouch for
        return UTF8
    if not all(_encodable(t, encodings) for t in texts):
        logger.info("output character set: UTF-8 (the source repertoire cannot hold our text)")
        return UTF8
    written = written_form(terms)
    if NOT_WRITTEN_FAITHFULLY.intersection(terms):
        logger.info("output character set: UTF-8 (pydicom writes GB 2312 without its escapes)")
        return UTF8
    if written != UTF8 and not round_trips(
        written, [*(("UT", t) for t in texts), *_copied_texts(source)]
    ):
        logger.info("output character set: UTF-8 (pydicom would not write the text faithfully)")
        return UTF8
    return written


def _encodable(text: str, encodings: Sequence[str]) -> bool:
    if text.isascii():
        return True
    for encoding in encodings:
        try:
            text.encode(encoding)
        except (UnicodeError, LookupError):
            continue
        return True
    return False


def results_character_set(source: Dataset, report: Report) -> str | list[str] | None:
    """The character set the DICOM results of ``report`` copy ``source``'s values in:
    :func:`output_character_set` of radserve's own text in its SEGs and SR (segment
    labels, model names and versions, concept and category meanings, classes, organ
    labels, software versions), UTF-8 where any of it does not fit the source's. An
    object none of whose own text needs UTF-8 keeps the source's set; where its objects
    differ, this is UTF-8, the set of those that carry such text."""
    texts = [report.radserve_version, fit(f"{report.pipeline.name} {report.pipeline.version}")]
    texts += [n for m in report.models for n in (m.name, m.version)]
    for label_map in report.outputs.label_maps:
        for s in label_map.segments:
            label = s.label if s.finding_id is None else f"Lesion {s.finding_id}"
            texts += [fit(label), fit(s.model), fit(s.model_version)]
            texts += [s.concept.meaning, s.category.meaning]
    texts += [fit(f"{c.step}: {c.label}") for c in report.classifications]
    texts += [m.label for m in report.organ_measurements]
    return output_character_set(source, texts)


def path_text(path: Path) -> str:
    """``Sequence[1].Keyword`` (items counted from 1, as the messages count them)."""
    within, keyword = path
    return "".join(f"{seq}[{index + 1}]." for seq, index in within) + keyword


def cut_copied(dataset: Dataset) -> list[str]:
    """Cut, in place, each copied attribute of ``dataset`` to its VR, in the copied
    sequences' items too (one of a VR no prefix of which is valid: written empty);
    where each cut was (:func:`path_text`, a top-level one is its keyword).

    Raises:
        CopiedValueTooLongError: a Type 1 attribute of such a VR is over its limit."""
    return cut_copied_as(dataset, encodings_of(dataset))


def cut_copied_as(dataset: Dataset, encodings: Sequence[str] | None) -> list[str]:
    """:func:`cut_copied`, counting bytes in ``encodings`` (the written object's character
    set, which is UTF-8 where radserve's own text does not fit the source's)."""
    cut = []
    for path, vr, size, element in list(_over_long_in(dataset, COPIED_KEYWORDS, (), encodings)):
        if vr not in CUT_VRS:
            if (kind := required_type(path)) is not None:
                raise CopiedValueTooLongError(
                    f"the source's {_where(path)} has a value of {size} bytes, over the "
                    f"{MAX_BYTES[vr]} {vr} allows, and it is Type {kind} (it may be neither "
                    "cut nor empty): no DICOM result can carry it; correct it at the source"
                )
            element.value = ""
        else:
            values = [fit_value(vr, v, encodings) for v in _values(element.value)]
            element.value = values if len(values) > 1 else values[0]
        cut.append(path_text(path))
    return cut


def shortened_values(
    dataset: Dataset | None, written_in: str | Sequence[str] | EllipsisType | None = ...
) -> list[tuple[str, str]]:
    """(code, message) of each source value the DICOM results will carry shortened,
    counted in ``written_in``, the character set they are written in
    (:func:`results_character_set`; before session 20 always the source's declared one,
    which is also the default here: a Latin-1 study whose results switch to UTF-8 had a
    64-'é' value cut to 32 letters without a warning)."""
    if dataset is None:
        return []
    encodings = encodings_of(dataset) if written_in is ... else encodings_for(written_in)
    measured = dataset  # as written: without the characters clean_copied drops
    if next(_not_admitted_in(dataset), None) is not None:
        measured = copy.deepcopy(dataset)
        clean_copied(measured)
    return [
        (
            VALUE_SHORTENED,
            f"{_where(path)} has "
            f"{'a component group' if vr == 'PN' else 'a value'} of {size} bytes: the DICOM "
            + _what_results_carry(path, vr)
            + " (the FHIR Bundle carries it whole)",
        )
        for path, vr, size, _ in _over_long_in(measured, COPIED_KEYWORDS, (), encodings)
    ] + reshaped_values(dataset)


# copied person names: PN holds at most 3 component groups of 5 components (PS3.5 6.2)
COPIED_NAMES = ("PatientName", "ReferringPhysicianName")
# copied values highdicom refuses unless valid: the results carry them empty
_CHECKED = (("PatientBirthDate", DA), ("StudyDate", DA), ("StudyTime", TM))


def pn_fitted(text: str) -> str:
    """``text`` (a PN as text) with at most 3 component groups and 5 components in each:
    further groups left out, further components joined to the fifth with spaces. A
    source name ``Al^Be^Ce^De^Ee^Fe=Ge=He=Ie`` was copied as it came, and dciodvfy
    refused the SEG and SR ("Too many delimiters (^) in PersonName")."""
    groups = []
    for group in text.split("=")[:3]:
        parts = group.split("^")
        if len(parts) > 5:
            parts = [*parts[:4], " ".join(p for p in parts[4:] if p)]
        groups.append("^".join(parts))
    return "=".join(groups)


def emptied_values(dataset: Dataset) -> list[str]:
    """Keywords of the copied values the results carry empty, not being valid: a
    Patient's Sex other than M, F or O, a date or time that is no DA or TM."""
    out = []
    if str(dataset.get("PatientSex", "") or "") not in ("", "M", "F", "O"):
        out.append("PatientSex")
    for keyword, parse in _CHECKED:
        try:
            parse(str(dataset.get(keyword, "") or ""))
        except ValueError:
            out.append(keyword)
    return out


def reshaped_values(dataset: Dataset) -> list[tuple[str, str]]:
    """(code, message) of each copied value the results carry otherwise than it came,
    other than by length: a name of too many components, an invalid date, time or sex,
    a value holding control characters or undefined bytes (:func:`clean_copied`).
    Before session 36 only the cuts were said; these went out changed without a word."""
    out = [
        (
            VALUE_SHORTENED,
            f"{_named(keyword)} has more than 3 component groups or 5 components in one: "
            "the DICOM results carry it with further components joined to the fifth and "
            "further groups left out (the FHIR Bundle carries it whole)",
        )
        for keyword in COPIED_NAMES
        if (value := str(dataset.get(keyword, "") or "")) and pn_fitted(value) != value
    ]
    out += [
        (
            VALUE_SHORTENED,
            f"{_named(keyword)} is not a valid "
            f"{dictionary_VR(keyword)} value: the DICOM results carry it empty",
        )
        for keyword in emptied_values(dataset)
    ]
    return out + cleaned_values(dataset)


def _what_results_carry(path: Path, vr: str) -> str:
    if vr in CUT_VRS:
        return f"results carry it cut to the {MAX_BYTES[vr]} bytes {vr} allows"
    if (kind := required_type(path)) is not None:
        return (
            f"results are not written: {vr} allows {MAX_BYTES[vr]} bytes, and the attribute "
            f"is Type {kind} (neither a cut nor an empty value is valid)"
        )
    return (
        f"results carry it empty ({vr} allows {MAX_BYTES[vr]} bytes, and a shorter {vr} "
        "would be another value)"
    )


def _where(path: Path) -> str:
    """ "Code Meaning (0008,0104) in Procedure Code Sequence (0008,1032) item 1"."""
    within, keyword = path
    parts = [_named(keyword)]
    parts += [f"in {_named(seq)} item {index + 1}" for seq, index in reversed(within)]
    return " ".join(parts)


def _named(keyword: str) -> str:
    tag = tag_for_keyword(keyword)
    if tag is None:  # a nested attribute without a keyword: its tag
        return keyword
    return f"{dictionary_description(tag)} {_tag_of(tag)}"


def _tag_of(tag: int) -> str:
    tag = Tag(tag)
    return f"({tag.group:04X},{tag.element:04X})"


__all__ = [
    "COPIED_KEYWORDS",
    "CUT_VRS",
    "MAX_BYTES",
    "VALUE_SHORTENED",
    "CopiedValueTooLongError",
    "clean_copied",
    "copied_text",
    "cut_copied",
    "cut_copied_as",
    "encoded_size",
    "encodings_for",
    "encodings_of",
    "fit_value",
    "output_character_set",
    "over_long",
    "path_text",
    "results_character_set",
    "round_trips",
    "shortened_values",
    "written_form",
]
