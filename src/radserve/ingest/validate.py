"""Everything the outputs will need from a series, checked before any pixel is decoded.

Reports, DICOM SEG and SR are written after the models ran; a value they cannot use
must fail the job at ingest, not after minutes of inference. Refused here: an instance
:mod:`~radserve.ingest.headers` found unusable (truncated, frame count or pixel format
inconsistent with the data, nonsense rescale), no or several Study Instance UIDs, images
of several patients, no or several Frames of Reference, a SOP Class radserve does not
read, a patient or request identifier holding several values or control characters.
Flagged (a warning on the loaded series, which reaches the report): Type 2
attributes the SEG/SR copy from the source but that are absent (they are written empty),
and images whose values were lossy compressed (the models ran on approximations).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydicom.uid import UID
from pydicom.valuerep import MAX_VALUE_LEN

from radserve.errors import DecodeError, StudyError
from radserve.ingest.discover import SeriesHeader
from radserve.ingest.headers import FrameRef, PatientInfo
from radserve.ingest.sources import InputTooLargeError


class InstanceError(StudyError):
    """One instance of the series cannot be used; the message names the instance (by
    Instance Number and SOP Instance UID, never by its file) and the reason."""

    code = "instance_invalid"


class LossyInputError(StudyError):
    """Lossy compressed images where ``ingest.lossy_input`` is ``refuse``."""

    code = "lossy_input"


class SeriesAttributeError(StudyError):
    """A series-level attribute the outputs need is missing or inconsistent."""

    code = "attribute_invalid"


def check_study_patients(series: Sequence[SeriesHeader]) -> None:
    """Refuse a study whose series name more than one patient (``series``: those of one
    Study Instance UID). Its results are filed into that study and name one patient:
    before session 35 a study holding a misfiled series of another patient ran, and its
    DICOM SEG/SR went back into the mixed study under whichever patient the selected
    series named. The attributes that differ are named, never their values."""
    if not series:
        return
    first = series[0]
    other = next((s for s in series[1:] if s.patient.identity != first.patient.identity), None)
    if other is None:
        return  # one series naming two patients: check_series says so, naming the series
    where = (
        f"series {other.series_number or '?'} and series {first.series_number or '?'} "
        f"differ in {', '.join(other.patient.differs_from(first.patient))}"
    )
    raise SeriesAttributeError(
        f"the series of one study name different patients ({where}): its results would "
        "be filed in a study holding another patient's images; correct the misfiled "
        "series at the source and send the study again"
    )


# C0 and C1 controls: none of LO, SH, PN or DA admits one once ISO 2022 escapes are decoded
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_UNDECODED = "\ufffd"  # what pydicom decodes a byte the character set lacks to


# the identifiers results are filed under, with their VR's limit in characters (None: PN,
# whose component groups the writers fit; a cut name still names the patient the ID does)
_IDENTIFIERS: tuple[tuple[str, str, int | None], ...] = (
    ("Patient ID", "patient_id", MAX_VALUE_LEN["LO"]),
    ("Issuer of Patient ID", "issuer_of_patient_id", MAX_VALUE_LEN["LO"]),
    ("Patient's Name", "patient_name", None),
    ("Patient's Birth Date", "patient_birth_date", None),
    ("Accession Number", "accession_number", MAX_VALUE_LEN["SH"]),
)


def check_patient_values(patient: PatientInfo) -> None:
    """Refuse identifiers the results would carry to the PACS, the RIS and FHIR in a form
    no receiver matches: several values where DICOM allows one (``A\\B`` became one FHIR
    identifier ``A\\B`` and two names one HumanName before session 36), control
    characters (a name has none left: :mod:`radserve.ingest.person_name` drops them),
    bytes the declared character set does not decode (the SR kept them as Latin-1, FHIR
    as U+FFFD: two outputs, two identifiers), or an ID longer than its VR allows (the SEG
    and SR carried it cut, FHIR whole: filed under an ID no PACS or RIS knows).
    The attribute is named, never its value."""
    for name, field, limit in _IDENTIFIERS:
        value: str = getattr(patient, field)
        if "\\" in value:
            raise SeriesAttributeError(
                f"{name} holds {value.count(chr(92)) + 1} values where DICOM allows one: "
                "results filed under it would name no patient or order the PACS, RIS or "
                "FHIR server knows; correct it at the source and send the study again"
            )
        if _CONTROL.search(value):
            raise SeriesAttributeError(
                f"{name} holds control characters, which its value representation does "
                "not allow: correct it at the source and send the study again"
            )
        if _UNDECODED in value:
            raise SeriesAttributeError(
                f"{name} holds bytes that are not characters of the study's Specific "
                "Character Set: results filed under it would name the patient or order "
                "differently in DICOM and FHIR; correct it (or the character set) at the "
                "source and send the study again"
            )
        if limit is not None and len(value) > limit:
            raise SeriesAttributeError(
                f"{name} is {len(value)} characters, more than the {limit} its value "
                "representation allows: results filed under it cut would name no patient "
                "or order the PACS or RIS knows; correct it at the source and send the "
                "study again"
            )


LOSSY_WORDS = "images were lossy compressed"  # in the warning: the report codes it by these


def check_series(header: SeriesHeader, warnings: list[str], *, lossy_input: str = "flag") -> None:
    """Raise for what makes ``header`` unusable; append what is merely flagged
    (``lossy_input``: ``IngestPolicy.lossy_input``, "refuse" raises for lossy images)."""
    _check_instances(header.frames)
    studies = {u for u in header.study_instance_uids if u}
    if not studies:
        raise SeriesAttributeError(
            "the series has no Study Instance UID: its results could not be filed in a study"
        )
    if len(header.study_instance_uids) > 1:
        raise SeriesAttributeError(
            f"the instances of one series carry {len(header.study_instance_uids)} different "
            "Study Instance UIDs (or some none): send each study's series on its own"
        )
    if header.patient_identities > 1:
        raise SeriesAttributeError(
            f"the instances of one series name {header.patient_identities} different patients "
            "(Patient ID, Issuer of Patient ID, Patient's Name or Birth Date differ): its "
            "results would carry one patient's identity over another's images; correct the "
            "instances at the source and send the series again"
        )
    check_patient_values(header.patient)
    frames_of_reference = header.frame_of_reference_uids
    if None in frames_of_reference or "" in frames_of_reference:
        raise SeriesAttributeError(
            "the series has no Frame of Reference UID on every instance: image positions "
            "cannot be tied to the patient, and DICOM SEG/SR need it"
        )
    if len(frames_of_reference) > 1:
        raise SeriesAttributeError(
            f"the instances of one series use {len(frames_of_reference)} Frames of Reference: "
            "their positions are not in one coordinate system"
        )
    sop_class = UID(header.sop_class_uid)
    if not _is_image_storage(sop_class):
        shown = sop_class.name if sop_class.name != sop_class else "an unknown SOP Class"
        raise SeriesAttributeError(
            f"the series is {shown}, not a standard image storage SOP Class (DICOM SEG/SR "
            "can reference only those)",
            code="sop_class_unsupported",
        )
    notes = list(dict.fromkeys(f"{f.label}: {f.note}" for f in header.frames if f.note))
    if notes:
        more = f" (and {len(notes) - 3} more instances)" if len(notes) > 3 else ""
        warnings.append("; ".join(notes[:3]) + more)
    lossy = [f for f in header.frames if f.pixel.lossy]
    if lossy:
        kinds = "; ".join(dict.fromkeys(f.pixel.lossy for f in lossy))
        ratios = [f.pixel.lossy_ratio for f in lossy if f.pixel.lossy_ratio]
        if ratios:
            kinds += f"; ratio up to {max(ratios):.3g}:1"
        said = f"{len(lossy)} of {len(header.frames)} {LOSSY_WORDS} ({kinds})"
        if lossy_input == "refuse":
            raise LossyInputError(
                f"{said}, and ingest.lossy_input is 'refuse'; send the original images, or "
                "set it to 'flag' to run such studies with a warning"
            )
        warnings.append(
            f"{said}: the models ran on approximations of the scanner's values, and "
            "measurements (volumes, diameters, densities) may differ from those on the "
            "original images"
        )
    if header.absent_type2:
        warnings.append(
            "Type 2 attributes absent from the source headers (DICOM SEG/SR carry them "
            f"empty): {', '.join(header.absent_type2)}"
        )


def _check_instances(frames: Sequence[FrameRef]) -> None:
    bad = [f for f in frames if f.problem is not None]
    if not bad:
        return
    first = bad[0]
    assert first.problem is not None
    # named by Instance Number and UID, never by file: a folder or member name is the
    # sender's: "<data dir>/studies/…zip!DOE^JOHN 123 19010203/CT/000.dcm: …" once
    # reached the job error any read key sees, and the failure notices
    others = len({f.sop_instance_uid for f in bad}) - 1
    more = f" (and {others} more of the series' {_instances(frames)} instances)" if others else ""
    message = f"{first.label}: {first.problem.text}{more}"
    error = {"decode_failed": DecodeError, "input_too_large": InputTooLargeError}.get(
        first.problem.code, InstanceError
    )
    raise error(message)


def _instances(frames: Sequence[FrameRef]) -> int:
    return len({f.sop_instance_uid for f in frames})


def _is_image_storage(uid: UID) -> bool:
    """A standard image storage SOP Class (pydicom's UID dictionary; the conformance
    statement's list is a subset): what highdicom can reference as a SEG/SR source."""
    return uid.type == "SOP Class" and "Image Storage" in uid.name
