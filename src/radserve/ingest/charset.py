"""The character set of a header that declares none but holds non-ASCII text.

Without Specific Character Set (0008,0005) text is in the default repertoire (ASCII), yet
senders write names in Latin-1 or UTF-8 without declaring either. pydicom then reads the
bytes as Latin-1: a UTF-8 name becomes mojibake ("MÃ¼ller") in the FHIR Patient, and
outputs that copy the bytes without declaring a set are invalid (dciodvfy: "Character
invalid for character repertoire"). The bytes say which it was: non-ASCII text that is
valid UTF-8 is UTF-8 (Latin-1 words almost never are), any other is Latin-1 (ISO_IR 100).

A header that declares UTF-8 (ISO_IR 192) alone over text that is not UTF-8 is the
common mislabel of Latin-1 bytes: pydicom put U+FFFD in place of each such byte, and a
PACS probe's ``M\xfcller^J\xf6rg`` went to the SEG, SR, FHIR, QIDO and the console as
``M\ufffdller^J\ufffdrg`` (session 36). It is read as Latin-1, as an undeclared one is.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydicom.charset import convert_encodings
from pydicom.datadict import dictionary_VR
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset

LATIN1 = "ISO_IR 100"
UTF8 = "ISO_IR 192"
# value representations whose text is in the Specific Character Set (PS3.5 6.1.2.3)
TEXT_VRS = frozenset({"SH", "LO", "ST", "LT", "UT", "UC", "PN"})


def undeclared_character_set(ds: Dataset) -> str | None:
    """The term for the non-ASCII text of ``ds`` when its declaration does not hold it:
    none declared (UTF-8 when all of it decodes as UTF-8, else Latin-1), or UTF-8
    declared over text that does not decode as UTF-8 (Latin-1). None when the
    declaration holds or the text is ASCII."""
    value = ds.get("SpecificCharacterSet")
    many = isinstance(value, Sequence) and not isinstance(value, str)
    terms = [str(v) for v in value] if many else [str(value or "")]
    declared = [t.strip() for t in terms if t.strip()]
    if declared and declared != [UTF8]:
        return None
    found = [raw for raw in _raw_text(ds) if not raw.isascii()]
    if not found:
        return None
    try:
        for raw in found:
            raw.decode("utf-8")
    except UnicodeDecodeError:
        return LATIN1
    return None if declared else UTF8


def declare_undeclared_character_set(ds: Dataset) -> Dataset:
    """Set Specific Character Set on ``ds`` (read, values not yet decoded) to what its
    undeclared text is, so pydicom decodes and re-encodes it as what it is."""
    term = undeclared_character_set(ds)
    if term is not None:
        ds.SpecificCharacterSet = term
        # pydicom decodes with the character set it read, not the one now set
        ds.set_original_encoding(*ds.original_encoding, convert_encodings([term]))
    return ds


def _raw_text(ds: Dataset) -> list[bytes]:
    """The top-level text values as stored (pydicom's default decoding undone for a value
    already read: Latin-1 maps every byte to one character)."""
    out = []
    for tag in list(ds.keys()):
        try:
            element = ds.get_item(tag, keep_deferred=True)  # a deferred value stays unread
            if isinstance(element, RawDataElement):
                vr = element.VR or (dictionary_VR(tag) if not tag.is_private else None)
                if vr in TEXT_VRS and isinstance(element.value, bytes):
                    out.append(element.value)
            elif element is not None and element.VR in TEXT_VRS and element.value:
                values = element.value if element.VM > 1 else [element.value]
                out += [str(v).encode("latin-1", "replace") for v in values]
        except Exception:  # a value pydicom cannot read: no text to judge by
            continue
    return out
