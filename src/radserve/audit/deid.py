"""De-identification of a job's results (PS3.15 Annex E, Basic Application Level
Confidentiality Profile) for research and vendor support.

Applied to every DICOM result (SEG, SR, SC) and to the JSON report, consistently:

* UIDs (action U): every UID that is not a DICOM-defined one (SOP classes, transfer
  syntaxes, ``1.2.840.10008.*``, coding schemes) is replaced by
  ``2.25.<HMAC-SHA256(key, uid) as a 128-bit integer>``. The key is derived from the
  audit key, so the same study gets the same pseudonymous UIDs in every file and every
  export (SEG -> SR references and the report's study UID stay consistent), and nobody
  without the key can map them back.
* Names (PN): emptied (Z). Patient ID: a keyed pseudonym ``ANON-<12 hex>`` (D).
* Dates and times (DA, DT, TM): replaced by dummies (19000101, 000000) — the profile's
  Z/D actions, no "Retain Longitudinal Temporal Information" option; ages are emptied.
* Other text (LO, SH, LT, ST, UT, UC, AE, UR, AS): kept only for attributes that
  describe radserve's own output (coded concepts, segment labels, SR text values,
  manufacturer and software of radserve), emptied otherwise (accession number,
  institution, descriptions, station, study id, ...). Private elements are removed.
* ``Patient Identity Removed`` = YES, ``De-identification Method`` and its code sequence
  (DCM 113100 Basic Application Confidentiality Profile; no profile option is claimed).

The JSON report gets the same UID mapping for every UID-shaped string, its patient and
date fields nulled and its job id replaced by a pseudonym. NIfTI label maps are copied
with their free-text header fields (descrip, aux_file, db_name, intent_name) emptied.
Key images (PNG) and the FHIR Bundle are not exported.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from pathlib import Path
from typing import Any

import pydicom
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import UID_dictionary

PROFILE = ("113100", "DCM", "Basic Application Confidentiality Profile")
DUMMY = {"DA": "19000101", "TM": "000000", "DT": "19000101000000"}
# text attributes that describe radserve's output, not the patient or the site
KEEP_TEXT = frozenset(
    {
        "CodeValue", "CodingSchemeDesignator", "CodingSchemeVersion", "CodeMeaning",
        "LongCodeValue", "URNCodeValue", "ContextIdentifier", "MappingResource",
        "ContextGroupVersion", "SegmentLabel", "SegmentDescription", "SegmentAlgorithmName",
        "ContentLabel", "ContentDescription", "ContentCreatorName", "TextValue",
        "TrackingIdentifier", "TrackingID", "AlgorithmVersion", "AlgorithmName",
        "AlgorithmSource", "AlgorithmParameters", "Manufacturer", "ManufacturerModelName",
        "DeviceSerialNumber", "SoftwareVersions", "SeriesDescription", "SpecificCharacterSet",
        "ImplementationVersionName",
        "SourceApplicationEntityTitle", "DeidentificationMethod", "ValueType",
        "RelationshipType", "ContinuityOfContent", "TemplateIdentifier", "GraphicType",
        "MeasurementUnitsCodeSequence", "LossyImageCompression",
        "LossyImageCompressionMethod", "PatientIdentityRemoved", "BurnedInAnnotation",
    }
)  # fmt: skip
# UID attributes whose values are defined by DICOM or a coding scheme, never by a study
KEEP_UIDS = frozenset(
    {"CodingSchemeUID", "MappingResourceUID", "ContextUID", "ImplementationClassUID"}
)
_UID_SHAPE = re.compile(r"^\d+(\.\d+){3,}$")


class Pseudonyms:
    """The keyed, consistent mapping of UIDs and patient IDs."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"radserve de-identification", hashlib.sha256).digest()

    def _mac(self, text: str) -> bytes:
        return hmac.new(self._key, text.encode(), hashlib.sha256).digest()

    def uid(self, uid: str) -> str:
        uid = str(uid).strip()
        if not uid or uid in UID_dictionary or uid.startswith("1.2.840.10008."):
            return uid
        return "2.25." + str(int.from_bytes(self._mac("uid:" + uid)[:16], "big"))

    def patient_id(self, value: str) -> str:
        return "ANON-" + self._mac("pid:" + value).hex()[:12]

    def job_id(self, value: str) -> str:
        return "anon-" + self._mac("job:" + value).hex()[:24]


def deidentify_dataset(ds: Dataset, names: Pseudonyms) -> None:
    """Apply the profile to ``ds`` in place (file meta included)."""
    ds.remove_private_tags()
    _clean(ds, names)
    meta = getattr(ds, "file_meta", None)
    if meta is not None and "MediaStorageSOPInstanceUID" in meta:
        meta.MediaStorageSOPInstanceUID = names.uid(meta.MediaStorageSOPInstanceUID)
    ds.PatientIdentityRemoved = "YES"
    ds.DeidentificationMethod = "radserve: PS3.15 E Basic Profile; keyed UIDs; dummy dates"
    code = Dataset()
    code.CodeValue, code.CodingSchemeDesignator, code.CodeMeaning = PROFILE
    ds.DeidentificationMethodCodeSequence = DicomSequence([code])


def _clean(ds: Dataset, names: Pseudonyms) -> None:
    for elem in list(ds):
        if elem.VR == "SQ":
            for item in elem.value or []:
                _clean(item, names)
            continue
        _clean_element(ds, elem, names)


def _clean_element(ds: Dataset, elem: DataElement, names: Pseudonyms) -> None:
    vr, keyword = elem.VR, elem.keyword
    if elem.value is None or elem.value == "":
        return
    if vr == "UI":
        if keyword.endswith("ClassUID") or keyword in KEEP_UIDS or keyword == "TransferSyntaxUID":
            return
        values = elem.value if elem.VM > 1 else [elem.value]
        mapped = [names.uid(v) for v in values]
        elem.value = mapped if elem.VM > 1 else mapped[0]
    elif vr == "PN":
        elem.value = ""
    elif vr in DUMMY:
        elem.value = DUMMY[vr]
    elif keyword == "PatientID":
        elem.value = names.patient_id(str(elem.value))
    elif (
        vr in ("LO", "SH", "LT", "ST", "UT", "UC", "AE", "UR", "AS") and keyword not in KEEP_TEXT
    ) or (vr == "CS" and keyword in ("PatientSex", "EthnicGroup")):
        elem.value = ""


def deidentify_report(report: dict[str, Any], names: Pseudonyms) -> dict[str, Any]:
    """The JSON report with the same UID mapping, no patient data and no dates."""

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, key) for v in value]
        if not isinstance(value, str):
            return value
        if key in ("job_id",):
            return names.job_id(value)
        if key.startswith("patient") or key in ("accession_number", "study_date"):
            return None
        if key.endswith(("_at", "_date", "_time", "datetime")):
            return None
        if _UID_SHAPE.match(value):
            return names.uid(value)
        return value

    out: dict[str, Any] = walk(report)
    out["deidentification"] = {
        "profile": "PS3.15 E.1 Basic Application Level Confidentiality Profile",
        "code": list(PROFILE),
        "uids": "2.25 UUID-derived, keyed (consistent with the DICOM files)",
        "dates": "removed",
    }
    return out


def deidentify_nifti(source: Path, target: Path) -> None:
    import nibabel as nib

    image = nib.load(str(source))
    header = image.header
    for field in ("descrip", "aux_file", "db_name", "intent_name"):
        if field in header:
            header[field] = b""
    nib.save(image, str(target))


def deidentify_file(source: Path, target: Path, names: Pseudonyms) -> None:
    ds = pydicom.dcmread(source)
    deidentify_dataset(ds, names)
    ds.save_as(target, enforce_file_format=True)


def write_report(source: Path, target: Path, names: Pseudonyms) -> None:
    data = json.loads(source.read_text(encoding="utf-8"))
    target.write_text(json.dumps(deidentify_report(data, names), indent=2), encoding="utf-8")


__all__ = [
    "PROFILE",
    "Pseudonyms",
    "deidentify_dataset",
    "deidentify_file",
    "deidentify_nifti",
    "deidentify_report",
    "write_report",
]
