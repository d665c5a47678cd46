"""The per-instance rules every door applies the same way: C-STORE, STOW-RS, the upload
form and ``radserve run`` (docs/conformance.md 1.1). A door never spells a rule itself:
it calls these, so the same instance gets the same answer, with the same reason, at
every door, and a new door cannot diverge.

- **UIDs** (SOP Instance, Study Instance UID): digits and dots, at most 64 characters
  (PS3.5 9.1). One with letters, an empty component or over 64 characters is refused:
  radserve's results reference it (SEG, SR, FHIR), and they would be invalid DICOM, and
  the gateway names its files by it. Leading zeros in a component (invalid too, but
  written by older equipment) are tolerated.
- **Transfer syntaxes refused on purpose**, with the reason: retired Explicit VR Big
  Endian and JPEG Extended (12-bit). The C-STORE SCP does not accept them in
  negotiation, STOW-RS answers 0xC122, the form and ``radserve run`` refuse the file
  (``instance_invalid``).
"""

from __future__ import annotations

import re

from pydicom.uid import UID, ExplicitVRBigEndian, JPEGExtended12Bit

_UID = re.compile(r"[0-9]+(\.[0-9]+)*")
MAX_UID_CHARS = 64

# JPEG Extended (process 2 & 4) carries 12-bit CT in practice, and no decoder radserve
# may ship decodes that: python-gdcm 3.2 and Pillow refuse 12-bit precision, and
# pylibjpeg-libjpeg is GPLv3. Accepting it meant C-STORE success and then a job that
# failed at decode; refusing it makes a sender fall back to a syntax it also offers.
# Explicit VR Big Endian was retired from DICOM in 2004 (PS3.5 A.3): no modality has
# to send it, every sender converts it, and a reader that took it at one door only
# made the doors disagree.
REFUSED_TRANSFER_SYNTAXES: dict[UID, str] = {
    JPEGExtended12Bit: (
        "JPEG Extended (process 2 & 4) is not accepted: its 12-bit data cannot be decoded "
        "with radserve's decoders (python-gdcm, Pillow; pylibjpeg-libjpeg is GPLv3); "
        "send it uncompressed or lossless (e.g. JPEG Lossless SV1)"
    ),
    ExplicitVRBigEndian: (
        "Explicit VR Big Endian (retired from DICOM in 2004) is not accepted; "
        "send it in Explicit VR Little Endian"
    ),
}


def uid_problem(value: object, what: str) -> str | None:
    """Why ``value`` is not a UID radserve can carry into its results, or None. The text
    names the attribute and the rule, never the value (it may be long, or not a UID)."""
    uid = str(value or "").strip().rstrip("\x00")
    if not uid:
        return f"{what} missing"
    if len(uid) > MAX_UID_CHARS:
        return (
            f"{what} is {len(uid)} characters long; a UID has at most {MAX_UID_CHARS} "
            "(PS3.5 9.1), and results referencing it would be invalid DICOM"
        )
    if _UID.fullmatch(uid) is None:
        return (
            f"{what} is not a valid UID (digits and dots only, PS3.5 9.1); results "
            "referencing it would be invalid DICOM"
        )
    return None


def transfer_syntax_problem(syntax: str) -> str | None:
    """radserve's reason for refusing ``syntax`` on purpose, or None."""
    return REFUSED_TRANSFER_SYNTAXES.get(UID(syntax)) if syntax else None


__all__ = ["MAX_UID_CHARS", "REFUSED_TRANSFER_SYNTAXES", "transfer_syntax_problem", "uid_problem"]
