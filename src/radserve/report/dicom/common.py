"""Pieces the SEG and SR writers share: source headers, UIDs, codes, equipment, charset.

Everything here is derived from the JSON :class:`~radserve.report.schema.Report` plus the
source instances' headers, never from pixel data. Patient and study attributes are
copied by highdicom from the first source header, so they stay as the source study has
them (see :func:`shield_patient_name` for the few values highdicom cannot take as is).
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code
from pydicom.uid import generate_uid

from radserve import durable
from radserve.domain import CodedConcept
from radserve.domain.equipment import MANUFACTURER
from radserve.errors import ReportError
from radserve.ingest.charset import (
    declare_undeclared_character_set,
)
from radserve.ingest.person_name import person_name_text
from radserve.ingest.policy import IngestPolicy
from radserve.models.dicom_text import LO_MAX_BYTES, fit
from radserve.report.dicom.frames import (
    SliceSources,
    check_multiframe_source,
    check_slice_references,
)
from radserve.report.schema import Report
from radserve.report.shortened import (
    MAX_BYTES,
    clean_copied,
    cut_copied_as,
    emptied_values,
    encodings_for,
    fit_value,
    pn_fitted,
    value_bytes,
)

logger = logging.getLogger(__name__)


SEG_SERIES_NUMBER = 901
SR_SERIES_NUMBER = 902
ML = Code("ml", "UCUM", "milliliter")  # pydicom's codedict has no millilitre


# --- source instances -------------------------------------------------------------------------
def read_headers(source_files: Sequence[Path], policy: IngestPolicy | None = None) -> list[Dataset]:
    """Header-only reads (no pixel data): all highdicom needs for references and geometry.
    Through the one header parser (:func:`radserve.ingest.headers.read_header`): values
    over 64 KiB are read when used, not held with every header while the results are
    written (a source slice's 50 MB Image Comments was read whole: +50 MB, 2026-12-03).
    ``policy``: the header bounds ingest accepted these files under (a site that raised
    ``ingest.max_header_bytes`` or ``max_header_elements`` must not have the results
    refused after the models ran); the defaults without one. A file without preamble and
    File Meta that ingest read is read the same way (it failed here, after the models)."""
    from radserve.ingest.headers import is_bare_dicom, read_header

    policy = policy or IngestPolicy()
    headers = []
    for i, path in enumerate(source_files):
        try:
            header = read_header(
                path,
                force=is_bare_dicom(path),  # as ingest read it: a file without File Meta
                max_header_bytes=policy.max_header_bytes,
                max_header_elements=policy.max_header_elements,
            )
            headers.append(declare_undeclared_character_set(header))
        except Exception as exc:  # pydicom raises many types on damaged input
            # File names may hold patient names: say which file by position only.
            raise ReportError(
                f"cannot read the DICOM header of source file {i + 1} of {len(source_files)} "
                f"({type(exc).__name__}); pass the files of the study the report was made from"
            ) from exc
    return headers


def slice_sources(report: Report, headers: Sequence[Dataset]) -> SliceSources:
    """The source header (and Enhanced frame) of every volume slice, in slice order
    (``geometry`` index order); refuses what DICOM SEG/SR cannot reference
    (:mod:`radserve.report.dicom.frames`).

    Extra headers (other series, SEG/SR already in the study) are ignored, so a whole study
    folder can be passed.
    """
    uids = report.geometry.source_sop_instance_uids
    frame_numbers = report.geometry.source_frame_numbers
    check_slice_references(uids, frame_numbers)
    by_uid = _copies_read(headers)
    instances = list(dict.fromkeys(uids))  # an Enhanced series: one instance, many slices
    missing = [u for u in instances if u not in by_uid]
    if missing:
        raise ReportError(
            f"{len(missing)} of {len(instances)} source instances of the report were not among the "
            f"{len(headers)} files given; pass the files of the series the report was made from"
        )
    sources = [by_uid[u] for u in uids]
    study = report.study.study_instance_uid
    if study and any(str(ds.get("StudyInstanceUID", "")) != study for ds in sources):
        raise ReportError("source instances belong to another study than the report")
    if not frame_numbers:
        return SliceSources(tuple(sources))
    check_multiframe_source(sources[0])
    return SliceSources(tuple(sources), tuple(n for n in frame_numbers if n is not None))


def _copies_read(headers: Sequence[Dataset]) -> dict[str, Dataset]:
    """One header per SOP Instance UID: of several copies of an instance (a study re-sent
    with a corrected name or ID keeps both, the second named by its content), the one
    ingest read: the file written last, the first found on a tie
    (:func:`radserve.ingest.discover.written_after`). Before session 36 the last in the
    order of the file names won, so about half the slices of a corrected re-send gave
    its SEG and SR the old patient, object by object."""
    from radserve.ingest.discover import written_after

    by_uid: dict[str, Dataset] = {}
    for ds in headers:
        if "SOPInstanceUID" not in ds:
            continue
        uid = str(ds.SOPInstanceUID)
        kept = by_uid.get(uid)
        if kept is None or (
            isinstance(ds.filename, str | Path)
            and isinstance(kept.filename, str | Path)
            and written_after(Path(ds.filename), Path(kept.filename))
        ):
            by_uid[uid] = ds
    return by_uid


def shield_patient_name(
    sources: Sequence[Dataset], character_set: str | list[str] | None
) -> tuple[list[Dataset], object]:
    """Sources for highdicom: a cleaned copy of the first header, plus the real name.

    highdicom 0.28 takes patient and study attributes from the first header and (1) for a
    one-component Patient's Name (``ANONYMOUS``, CJK names without ``^``) raises a
    UserWarning that quotes it, (2) refuses a Patient's Sex other than M/F/O and dates or
    times that are not valid DA/TM, failing the whole object. So highdicom sees a
    placeholder name, and malformed sex/date/time values become empty (Type 2; nothing
    to carry that a reader could trust). Type 2 attributes absent from a non-conformant
    source (ingest flags them) are added empty, as highdicom reads them unconditionally.
    :func:`restore_patient_name` puts the name back. Every other copied value loses the
    control characters its VR does not admit and the bytes its character set does not
    define (:func:`radserve.report.shortened.clean_copied`; the patient and request
    identifiers aside: ingest refuses those), and each text value over its VR's limit is
    cut to fit, counted in ``character_set``, the one the object is written in
    (:func:`output_character_set`; :mod:`radserve.report.shortened`; logged by keyword).
    """
    first = copy.deepcopy(sources[0])
    from radserve.ingest.headers import TYPE2_FOR_OUTPUTS  # flagged at ingest when absent

    for keyword in TYPE2_FOR_OUTPUTS:  # Type 2: highdicom needs them present, maybe empty
        if keyword not in first:
            setattr(first, keyword, "")
    name = first.get("PatientName")
    if name is not None:
        first.PatientName = "PLACEHOLDER^NAME"
        if "\x1b" in str(name):  # an escape sequence pydicom's decoding left (GB 2312)
            # decoded as ingest, FHIR and the report decode it (radserve.ingest.person_name):
            # before session 42 the DICOM results carried "Zhang^San=ESC$)A张^三"
            name = person_name_text(sources[0], "PatientName")
    if cleaned := clean_copied(first):  # before the cut: what is cut is what is written
        logger.warning(
            "source %s written without control characters or undefined bytes", ", ".join(cleaned)
        )
    if cut := cut_copied_as(first, encodings_for(character_set)):
        logger.warning("source %s written cut to the bytes their VRs allow", ", ".join(cut))
    for keyword in emptied_values(first):
        logger.info("source %s is not a valid DICOM value; written empty", keyword)
        setattr(first, keyword, "")
    referrer = str(first.get("ReferringPhysicianName", "") or "")
    if referrer and pn_fitted(referrer) != referrer:
        logger.info("source Referring Physician's Name has too many components; fitted")
        first.ReferringPhysicianName = pn_fitted(referrer)
    return [first, *sources[1:]], name


def restore_patient_name(
    dataset: Dataset, name: object, character_set: str | list[str] | None
) -> None:
    """Put the source's Patient's Name back, each component group cut to PN's 64 bytes in
    ``character_set`` (the object's, :func:`output_character_set`): a source may hold
    any length (a 65,534-byte name was copied whole, and dciodvfy rejected every SEG and
    SR). The cut is logged, never the name; the report says so too
    (:mod:`radserve.report.shortened`)."""
    if name is None:
        return
    if (fitted := pn_fitted(str(name))) != str(name):
        logger.warning("source Patient's Name has too many component groups or components; fitted")
        name = fitted
    encodings = encodings_for(character_set)
    if (longest := value_bytes("PN", str(name), encodings)) > MAX_BYTES["PN"]:
        logger.warning(
            "source Patient's Name has a component group of %d bytes; written cut to the "
            "%d DICOM allows",
            longest,
            MAX_BYTES["PN"],
        )
        name = fit_value("PN", str(name), encodings)
    dataset.PatientName = name


# --- identifiers ------------------------------------------------------------------------------
def report_uid(report: Report, *parts: str) -> str:
    """A UID that is the same every time the same report is written.

    Re-exporting a report therefore replaces the earlier instances in a PACS instead of
    adding duplicates, and the SEG and SR agree on tracking UIDs without reading each other.
    """
    entropy = [
        report.study.study_instance_uid or "",
        report.geometry.frame_of_reference_uid or "",
        report.generated_at.isoformat(),
        report.job_id or "",
        *parts,
    ]
    return str(generate_uid(entropy_srcs=entropy))


def finding_key(finding_id: int) -> str:
    return f"finding:{finding_id}"


def organ_key(model: str, value: int) -> str:
    return f"organ:{model}:{value}"


def classification_key(step: str) -> str:
    return f"class:{step}"


def tracking_uid(report: Report, key: str) -> str:
    """The tracking UID of a finding or organ: the one its lineage assigned (stable across
    re-runs of the study, see :mod:`radserve.service.lineage`), else one of this report."""
    if report.lineage is not None and key in report.lineage.tracking_uids:
        return report.lineage.tracking_uids[key]
    return report_uid(report, "tracking", key)


# --- generations (a re-run supersedes the earlier result) -------------------------------------
SERIES_NUMBER_STEP = 10  # generation g writes series 901 + 10 (g - 1), 902 + ..., 903 + ...


def generation(report: Report) -> int:
    return report.lineage.generation if report.lineage is not None else 1


def series_number(base: int, report: Report) -> int:
    """Distinct series numbers per generation, so a viewer lists each result apart."""
    return base + SERIES_NUMBER_STEP * (generation(report) - 1)


def series_description(text: str, report: Report) -> str:
    """``text``, and for a re-run which version it is and that it replaces the one before."""
    g = generation(report)
    return text if g == 1 else lo(f"{text} v{g} (current; replaces v{g - 1})")


def lesion_name(finding_id: int) -> str:
    """Segment label and tracking identifier of a finding, e.g. ``Lesion 3``."""
    return f"Lesion {finding_id}"


# --- codes ------------------------------------------------------------------------------------
def coded(concept: CodedConcept) -> hd.sr.CodedConcept:
    return hd.sr.CodedConcept(concept.value, concept.scheme, concept.meaning)


def organ_concepts(report: Report) -> dict[str, CodedConcept]:
    """Organ label -> SNOMED concept, from organ measurements and organ segments."""
    concepts = {m.label: m.concept for m in report.organ_measurements}
    for label_map in report.outputs.label_maps:
        if label_map.kind in ("organs", "structures"):
            for seg in label_map.segments:
                concepts.setdefault(seg.label, seg.concept)
    return concepts


def procedure_code(modality: str | None) -> Code:
    """Procedure Reported of TID 1500 from the source modality."""
    if modality == "CT":
        return codes.LN.CTUnspecifiedBodyRegion
    if modality == "MR":
        return codes.LN.MRIUnspecifiedBodyRegion
    return Code("363679005", "SCT", "Imaging")


# --- equipment --------------------------------------------------------------------------------
def device_serial_number() -> str:
    """Type 1 in the Enhanced General Equipment module: the host names the installation."""
    return (socket.gethostname() or "unknown")[:LO_MAX_BYTES]


def device_uid() -> str:
    """Device Observer UID: the same for every report of this installation."""
    return str(generate_uid(entropy_srcs=["radserve device observer", device_serial_number()]))


def software_versions(report: Report) -> list[str]:
    return [report.radserve_version, lo(f"{report.pipeline.name} {report.pipeline.version}")]


def contributing_equipment(
    report: Report, models: Iterable[tuple[str, str]], purpose: str
) -> list[hd.ContributingEquipment]:
    """One Contributing Equipment item per model: radserve as processing equipment."""
    when = report.generated_at.astimezone(dt.UTC).replace(tzinfo=None)
    return [
        hd.ContributingEquipment(
            MANUFACTURER,
            codes.DCM.ProcessingEquipment,
            manufacturer_model_name=lo(name),
            software_versions=[report.radserve_version, lo(f"{name} {version}")],
            device_serial_number=device_serial_number(),
            contribution_datetime=when,
            contribution_description=f"{purpose} by AI model {name} {version} (radserve)"[:1024],
        )
        for name, version in dict.fromkeys(models)
    ]


def lo(text: str) -> str:
    """Fit a Long String (64 bytes as UTF-8: :func:`radserve.models.dicom_text.fit`)."""
    return fit(text, LO_MAX_BYTES)


# --- character set ----------------------------------------------------------------------------
def set_character_set(dataset: Dataset, value: str | list[str] | None) -> None:
    """Set Specific Character Set after highdicom built the object.

    highdicom 0.28 rejects valid terms (an empty first value before ISO 2022 extensions,
    and ISO 2022 IR 149, which its enum misspells as IR 159), so the objects are built
    without one and it is set here; pydicom encodes text only when the file is written.
    """
    if value is None:
        if "SpecificCharacterSet" in dataset:
            del dataset.SpecificCharacterSet
    else:
        dataset.SpecificCharacterSet = value


# --- files ------------------------------------------------------------------------------------
def save_atomic(dataset: Dataset, path: Path) -> Path:
    """Write ``dataset`` as a DICOM file, durably (:mod:`radserve.durable`): readers
    never see a half-written file, and a written result survives a power cut."""
    try:
        return durable.write_with(
            Path(path), lambda handle: dataset.save_as(handle, enforce_file_format=True)
        )
    except Exception as exc:
        # The exception text may quote attribute values (patient name): OS reason or type only.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ReportError(f"cannot write a DICOM result file ({reason})") from exc


def same_grid(report: Report, affine: np.ndarray, shape: tuple[int, int, int]) -> bool:
    """Whether a label map lies on the report's input grid (NIfTI stores float32)."""
    expected = np.asarray(report.geometry.affine, dtype=float)
    return tuple(shape) == tuple(report.geometry.shape) and bool(
        np.allclose(np.asarray(affine, float), expected, atol=1e-3)
    )
