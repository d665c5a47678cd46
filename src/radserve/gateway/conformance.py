"""What radserve accepts and sends on the DICOM network: the conformance statement as data.

``docs/conformance.md`` describes these tables in prose; a test checks that the SCP
negotiates exactly them, so the document and the code cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum

from pydicom.uid import (
    HTJ2K,
    JPEG2000,
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    HTJ2KLossless,
    HTJ2KLosslessRPCL,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGLossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)
from pynetdicom import AllStoragePresentationContexts
from pynetdicom import sop_class as sc
from pynetdicom.service_class import QueryRetrieveServiceClass
from pynetdicom.status import STATUS_SUCCESS, STATUS_WARNING, code_to_category

from radserve.ingest import rules
from radserve.ingest.sop_classes import VOLUME_IMAGE_STORAGE

# Image storage: what radserve files into a study folder and hands to intake. The
# cross-sectional classes (radserve.ingest.sop_classes) feed the pipelines; the rest
# travel with CT/MR studies when a PACS forwards a whole study, and series selection
# passes them over.
IMAGE_STORAGE: tuple[UID, ...] = VOLUME_IMAGE_STORAGE + tuple(
    UID(uid)
    for uid in (
        sc.EnhancedMRColorImageStorage,
        sc.NuclearMedicineImageStorage,
        sc.ComputedRadiographyImageStorage,
        sc.DigitalXRayImageStorageForPresentation,
        sc.DigitalXRayImageStorageForProcessing,
        sc.DigitalMammographyXRayImageStorageForPresentation,
        sc.DigitalMammographyXRayImageStorageForProcessing,
        sc.BreastTomosynthesisImageStorage,
        sc.UltrasoundImageStorage,
        sc.UltrasoundMultiFrameImageStorage,
        sc.XRayAngiographicImageStorage,
        sc.EnhancedXAImageStorage,
        sc.XRayRadiofluoroscopicImageStorage,
        sc.EnhancedXRFImageStorage,
        sc.XRay3DAngiographicImageStorage,
        sc.SecondaryCaptureImageStorage,
        sc.MultiFrameSingleBitSecondaryCaptureImageStorage,
        sc.MultiFrameGrayscaleByteSecondaryCaptureImageStorage,
        sc.MultiFrameGrayscaleWordSecondaryCaptureImageStorage,
        sc.MultiFrameTrueColorSecondaryCaptureImageStorage,
    )
)

# Every storage SOP class pynetdicom knows: with the "quarantine" policy the SCP accepts
# the non-image ones too (SR, SEG, presentation states, waveforms ...) and keeps them
# aside, so a PACS pushing a whole study never sees a failure for them.
ALL_STORAGE: tuple[UID, ...] = tuple(
    UID(cx.abstract_syntax) for cx in AllStoragePresentationContexts if cx.abstract_syntax
)

# What the SCP accepts, in its order of preference when a sender offers several for one
# context (pynetdicom picks the acceptor's first match): uncompressed first, because it is
# the fastest to ingest; then lossless compression; lossy last, so radserve never makes a
# sender compress lossily. Retired Explicit VR Big Endian is not accepted.
SCP_TRANSFER_SYNTAXES: tuple[UID, ...] = (
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    DeflatedExplicitVRLittleEndian,
    JPEGLosslessSV1,
    JPEGLossless,
    JPEGLSLossless,
    JPEG2000Lossless,
    HTJ2KLossless,
    HTJ2KLosslessRPCL,
    RLELossless,
    JPEGBaseline8Bit,
    JPEGLSNearLossless,
    JPEG2000,
    HTJ2K,
)

# Transfer syntaxes refused on purpose, with the reason given to the sender (the SCP
# does not accept them in negotiation; STOW-RS answers 0xC122 for each such instance; the
# form and `radserve run` refuse the file): one table for every door, in ingest.rules.
REFUSED_TRANSFER_SYNTAXES = rules.REFUSED_TRANSFER_SYNTAXES

UNCOMPRESSED: tuple[UID, ...] = (ExplicitVRLittleEndian, ImplicitVRLittleEndian)
VERIFICATION = UID(sc.Verification)

# Results radserve sends (SCU): proposed only as needed, one context per (SOP class,
# transfer syntax) of the files in an association.
SEGMENTATION = UID(sc.SegmentationStorage)
COMPREHENSIVE_3D_SR = UID(sc.Comprehensive3DSRStorage)
# The non-image classes radserve writes: the SCP accepts them under every policy, so a
# PACS re-sending radserve's own results gets success (they are recognised and dropped,
# see radserve.gateway.own_results); other objects of these classes follow the policy.
RESULT_STORAGE: tuple[UID, ...] = (SEGMENTATION, COMPREHENSIVE_3D_SR)


# Where standard storage SOP classes live (PS3.6 A.1); ones newer than pynetdicom too
STORAGE_ROOT = "1.2.840.10008.5.1.4.1.1."
_UID_TEXT = re.compile(r"(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*")


def unlisted_storage(proposed: Iterable[str], listed: Iterable[str]) -> list[UID]:
    """The proposed SOP classes the SCP takes in under ``quarantine`` beyond its list:
    private ones (e.g. Siemens CSA Non-Image Storage, 1.3.12.2.1107.5.9.1, in most
    Siemens CT and MR studies) and standard storage classes pynetdicom does not know.
    Rejecting one context can fail a PACS's whole transfer: Orthanc 1.10.1 then sends
    none of the study's instances (its C-MOVE answers "Failed: UnableToProcess")."""
    known = set(listed)
    extra: list[UID] = []
    for value in proposed:
        if not is_uid(value):
            continue
        uid = UID(str(value))
        if uid in known or uid in extra or uid.is_transfer_syntax:
            continue
        if uid.is_private or uid.startswith(STORAGE_ROOT):
            extra.append(uid)
    return extra


def is_uid(value: object) -> bool:
    """Digits and dots as PS3.5 9.1 spells a UID (no leading zeros, at most 64)."""
    text = str(value)
    return len(text) <= 64 and _UID_TEXT.fullmatch(text) is not None


class UnwantedPolicy(StrEnum):
    """What the SCP does with storage SOP classes that are not images."""

    QUARANTINE = "quarantine"  # accept, keep in data_dir/quarantine, log; never processed
    REFUSE = "refuse"  # do not accept the presentation context at association time


# C-STORE response statuses (PS3.4 B.2.3, PS3.7 C).
class Status:
    SUCCESS = 0x0000
    OUT_OF_RESOURCES = 0xA700
    CANNOT_UNDERSTAND = 0xC000
    PROCESSING_FAILURE = 0x0110
    SOP_CLASS_NOT_SUPPORTED = 0x0122
    DATA_SET_MISMATCH = 0xA900  # C-STORE: the data set does not match the SOP Class
    INVALID_ARGUMENT = 0x0115  # N-EVENT-REPORT: an unknown or already settled transaction


# Failure statuses worth another attempt later: the receiver's trouble is temporary.
RETRYABLE_FAILURES = (
    (0xA700, 0xA7FF),  # refused: out of resources
    (0x0110, 0x0110),  # processing failure (Orthanc, dcmtk answer it for disk trouble)
    (0x0213, 0x0213),  # resource limitation
)


def is_success(status: int) -> bool:
    """Stored by the receiver: success or any warning (PS3.7 C: 0x0001, 0x0107, 0x0116,
    0xBxxx, e.g. 0xB000 coercion, 0xB006 elements discarded, 0xB007 data set does not
    match the SOP class). By category, as pynetdicom classifies them, not by a list of
    known codes: a PACS's own 0xBxxx warning also means it kept the instance."""
    return code_to_category(status) in (STATUS_SUCCESS, STATUS_WARNING)


def is_retryable_status(status: int) -> bool:
    """Whether a failed C-STORE may succeed later without changing anything here."""
    return any(low <= status <= high for low, high in RETRYABLE_FAILURES)


# A-ASSOCIATE-RJ (PS3.8 9.3.4): (source, reason) -> text; result 1 permanent, 2 transient.
REJECT_REASONS: dict[tuple[int, int], str] = {
    (1, 1): "no reason given",
    (1, 2): "application context name not supported",
    (1, 3): "calling AE title not recognised",
    (1, 7): "called AE title not recognised",
    (2, 1): "no reason given (ACSE)",
    (2, 2): "protocol version not supported",
    (3, 1): "temporary congestion",
    (3, 2): "local limit exceeded",
}
REJECTED_PERMANENT = 0x01
REJECTED_TRANSIENT = 0x02


# Presentation context results other than acceptance (PS3.8 9.3.3.2), as the SCP's log
# names them.
CONTEXT_RESULTS: dict[int, str] = {
    0x01: "refused by radserve",
    0x02: "refused (no reason)",
    0x03: "SOP class not supported",
    0x04: "transfer syntaxes not supported",
}


# what radserve says of a Query/Retrieve context (C-FIND, C-MOVE, C-GET) it refuses
NOT_QUERY_RETRIEVE = (
    "radserve is no Query/Retrieve SCP: it takes studies sent to it by C-STORE; ask the "
    "PACS to C-MOVE a study to radserve's AE title (docs/conformance.md section 8)"
)


def refused_context(abstract_syntax: str, proposed: Sequence[str], result: int) -> str:
    """One refused presentation context in words: its SOP class, what the sender
    proposed, DICOM's result reason and radserve's own reason, so the log says why a
    modality reports "no presentation context": for refused transfer syntaxes (0x04)
    why each is refused, for a Query/Retrieve class that radserve serves none. The
    syntaxes' reasons only with 0x04: a C-MOVE SCU's context (pynetdicom proposes Big
    Endian among others) read "SOP class not supported (Explicit VR Big Endian ... is
    not accepted ...)", as though another syntax would have done."""
    syntaxes = ", ".join(UID(s).name for s in proposed) or "none"
    text = f"{UID(abstract_syntax).name} in {syntaxes}: {CONTEXT_RESULTS.get(result, hex(result))}"
    reasons: list[str] = []
    if result == 0x04:
        reasons = [
            REFUSED_TRANSFER_SYNTAXES[UID(s)] for s in proposed if s in REFUSED_TRANSFER_SYNTAXES
        ] or ["accepted are those of docs/conformance.md section 2.4"]
    elif result == 0x03 and _is_query_retrieve(abstract_syntax):
        reasons = [NOT_QUERY_RETRIEVE]
    return text + "".join(f" ({reason})" for reason in reasons)


def _is_query_retrieve(abstract_syntax: str) -> bool:
    """Whether a SOP class is a Query/Retrieve information model (FIND, MOVE or GET)."""
    return issubclass(sc.uid_to_service_class(abstract_syntax), QueryRetrieveServiceClass)
