"""The DICOM failure notice: a small TID 1500 Comprehensive 3D SR saying the AI analysis
of a study failed, for the PACS that sent the study (``results.failure_notice`` sr|both).

Content: the usual observation context (device observer radserve) and procedure
reported, no Imaging Measurements, and a Qualitative Evaluations container with
"AI analysis status" = "AI analysis failed", the error code and radserve's
human-readable reason (see :mod:`radserve.report.dicom.notes`). Flags: COMPLETE,
UNVERIFIED, FINAL. It lies in the source study, in a series of its own
(:data:`FAILURE_SR_SERIES_NUMBER`), with Manufacturer and Contributing Equipment naming
radserve, so a PACS re-sending the study with it is recognised as radserve's own object
(:mod:`radserve.gateway.own_results`).

Patient and study attributes are the study's identifiers only: Patient's Name, Patient
ID and its issuer, Study Instance UID, Study ID, Accession Number, Study Date/Time and
Referring Physician's Name from the first received header; Patient's Birth Date and Sex
are left empty (Type 2). The evidence lists the received instances by UID. UIDs derive
from the job id, so a notice sent again for the same job replaces the first.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

import highdicom as hd
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid

from radserve import __version__
from radserve.errors import ReportError
from radserve.ingest.charset import declare_undeclared_character_set
from radserve.ingest.headers import header_text
from radserve.report.dicom import common, notes
from radserve.report.shortened import output_character_set

logger = logging.getLogger(__name__)

FAILURE_SR_SERIES_NUMBER = 909
FAILURE_SR_FILE = "failure-notice-sr.dcm"
_STUDY_KEYWORDS = (
    "PatientName",
    "PatientID",
    "IssuerOfPatientID",
    "StudyInstanceUID",
    "StudyID",
    "AccessionNumber",
    "StudyDate",
    "StudyTime",
    "ReferringPhysicianName",
    "SpecificCharacterSet",
)
_REFERENCE_KEYWORDS = ("StudyInstanceUID", "SeriesInstanceUID", "SOPClassUID", "SOPInstanceUID")


def failure_text(error_code: str, reason: str) -> str:
    """What a reader sees: the failure, its code and radserve's reason (never header values)."""
    return (
        f"Automated analysis failed ({error_code}): {reason}. No AI result exists for this study."
    )


def build_failure_sr(
    headers: Sequence[Dataset],
    *,
    job_id: str,
    error_code: str,
    reason: str,
    when: dt.datetime,
) -> Dataset:
    """The failure notice SR for the study of ``headers`` (the received instances' headers;
    those of other studies are ignored). Raises :class:`ReportError` without a usable one."""
    usable = [
        declare_undeclared_character_set(h)
        for h in headers
        if all(header_text(h, k) for k in _REFERENCE_KEYWORDS)
    ]
    if not usable:
        raise ReportError("no received instance has the UIDs a DICOM failure notice references")
    study_uid = header_text(usable[0], "StudyInstanceUID")
    evidence = [_reference(h, study=i == 0) for i, h in enumerate(usable)]
    evidence = [e for e in evidence if str(e.StudyInstanceUID) == study_uid]
    evidence = list({str(e.SOPInstanceUID): e for e in evidence}.values())
    summary = failure_text(error_code, reason)
    character_set = output_character_set(evidence[0], [summary, error_code])
    shielded, patient_name = common.shield_patient_name(evidence, character_set)
    device = hd.sr.DeviceObserverIdentifyingAttributes(
        uid=common.device_uid(),
        name=common.MANUFACTURER,
        manufacturer_name=common.MANUFACTURER,
        model_name=common.MANUFACTURER,
        serial_number=common.device_serial_number(),
    )
    context = hd.sr.ObservationContext(
        observer_device_context=hd.sr.ObserverContext(
            observer_type=codes.DCM.Device, observer_identifying_attributes=device
        )
    )
    modality = header_text(usable[0], "Modality") or None
    when_naive = when.astimezone(dt.UTC).replace(tzinfo=None)
    try:
        root = _report_without_measurements(context, common.procedure_code(modality))
        notes.append_to_root(
            root,
            notes.evaluations(
                [
                    notes.code(notes.ANALYSIS_STATUS, notes.ANALYSIS_FAILED),
                    notes.text(notes.ERROR_CODE, common.lo(error_code)),
                    notes.text(notes.FAILURE_REASON, summary),
                ]
            ),
        )
        sr = hd.sr.Comprehensive3DSR(
            evidence=shielded,
            content=root,
            series_instance_uid=_uid(job_id, "failure-sr-series"),
            series_number=FAILURE_SR_SERIES_NUMBER,
            sop_instance_uid=_uid(job_id, "failure-sr"),
            instance_number=1,
            manufacturer=common.MANUFACTURER,
            is_complete=True,
            is_final=True,
            series_description="radserve AI analysis failed",
            manufacturer_model_name=common.MANUFACTURER,
            software_versions=[__version__],
            device_serial_number=common.device_serial_number(),
            contributing_equipment=[
                hd.ContributingEquipment(
                    common.MANUFACTURER,
                    codes.DCM.ProcessingEquipment,
                    manufacturer_model_name=common.MANUFACTURER,
                    software_versions=[__version__],
                    device_serial_number=common.device_serial_number(),
                    contribution_datetime=when_naive,
                    contribution_description=lo_text(f"AI analysis failed ({error_code})"),
                )
            ],
            specific_character_set=None,  # set below: see common.set_character_set
        )
    except (ValueError, TypeError, AttributeError, KeyError) as exc:  # KeyError: highdicom
        # knows no IOD for the evidence's SOP Class UID (found by the instance fuzz target)
        raise ReportError(f"the DICOM failure notice could not be built: {exc!r}") from exc
    common.restore_patient_name(sr, patient_name, character_set)
    if evidence[0].get("IssuerOfPatientID"):
        sr.IssuerOfPatientID = evidence[0].IssuerOfPatientID
    notes.declare_scheme(sr)
    common.set_character_set(sr, character_set)
    return sr


def _report_without_measurements(
    context: hd.sr.ObservationContext, procedure: object
) -> hd.sr.ContainerContentItem:
    """TID 1500's root without Imaging Measurements. highdicom 0.28 insists on at least
    one measurement group, so it gets a placeholder whose container is then removed
    (TID 1500 needs Imaging Measurements or Qualitative Evaluations, not both)."""
    placeholder = hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(identifier="placeholder")
    )
    content = hd.sr.MeasurementReport(
        observation_context=context,
        procedure_reported=procedure,  # type: ignore[arg-type]
        imaging_measurements=[placeholder],
    )
    root = content[0]
    items = root.ContentSequence
    for index in reversed(range(len(items))):
        name = items[index].ConceptNameCodeSequence[0]
        if (name.CodeValue, name.CodingSchemeDesignator) == ("126010", "DCM"):
            del items[index]
    return root  # type: ignore[no-any-return]


def lo_text(text: str) -> str:
    """Fit a Short Text (1024 characters)."""
    return text[:1024]


def _reference(header: Dataset, *, study: bool) -> Dataset:
    """A copy of ``header`` with only the UIDs (and, for the first, the study's
    identifiers): highdicom copies patient and study attributes from the first."""
    out = Dataset()
    if study:  # Type 2 in the Patient module; not the study's identifiers: empty
        out.PatientBirthDate = ""
        out.PatientSex = ""
    for keyword in _REFERENCE_KEYWORDS:  # read as every intake reads them (header_text)
        setattr(out, keyword, header_text(header, keyword))
    for keyword in _STUDY_KEYWORDS if study else ():
        try:  # the value itself (a Patient's Name keeps its components and charset)
            value = header.data_element(keyword).value if keyword in header else None  # type: ignore[union-attr]
        except Exception:  # pydicom cannot convert it: absent, as header_text has it
            continue
        if value is not None:
            setattr(out, keyword, value)
    return out


def _uid(job_id: str, what: str) -> str:
    return str(generate_uid(entropy_srcs=[job_id, what]))


__all__ = ["FAILURE_SR_FILE", "FAILURE_SR_SERIES_NUMBER", "build_failure_sr", "failure_text"]
