"""Person Name (PN) values decoded with the dataset's character set, component by component.

pydicom decodes a PN through :class:`pydicom.valuerep.PersonName` and the Specific
Character Set. For ISO 2022 code extensions it relies on Python's codecs to strip the
escape sequences, and for ``ISO 2022 IR 58`` (GB 2312) the codec it uses does not: the
decoded text keeps ``ESC $ ) A`` (pydicom 3.0). Text with ESC control characters is
no name (a FHIR server stores it as given, a RIS shows garbage). So each component
(the groups alphabetic=ideographic=phonetic, and in each family^given^middle^prefix^
suffix) is decoded on its own — PS3.5 6.1.2.5.3 resets the code set at every ``^``
and ``=`` — and a component that still holds an escape sequence is decoded here from
its bytes: every ISO 2022 escape sequence pydicom knows selects its codec, whether or
not the Specific Character Set declared it (the sequence names the set unambiguously).
Unknown escape sequences are dropped; no control character survives.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from pydicom.charset import CODES_TO_ENCODINGS, convert_encodings, decode_bytes
from pydicom.dataset import Dataset
from pydicom.valuerep import PN_DELIMS

from radserve.ingest.charset import undeclared_character_set

logger = logging.getLogger(__name__)

ESC = b"\x1b"
_FRAGMENTS = re.compile(b"(^[^\x1b]+|\x1b[^\x1b]*)")
# ESC, intermediate bytes 0x20-0x2F, final byte 0x30-0x7E (ISO 2022 / ECMA-35)
_ESCAPE = re.compile("\x1b[\x20-\x2f]*[\x30-\x7e]?")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
# Python codecs that consume their own escape sequences (pydicom's handled_encodings,
# minus GB 2312, whose codec does not).
_ISO2022_CODECS = {"iso2022_jp", "iso2022_jp_2"}
_GB2312 = {"iso_ir_58", "gb2312"}


def person_name_groups(dataset: Dataset, keyword: str = "PatientName") -> tuple[str, ...]:
    """The name's component groups (alphabetic, ideographic, phonetic), each as
    ``family^given^middle^prefix^suffix`` text without escape or control characters.
    Trailing empty groups are dropped; ``()`` when the element is absent or empty."""
    try:
        element = dataset.get_item(keyword)
    except Exception:  # an undecodable raw element: nothing trustworthy to show
        logger.warning("%s could not be read; left out", keyword)
        return ()
    raw = element.value if element is not None else None
    if isinstance(raw, bytes):
        # Still as read from the file: decode the bytes here (pydicom's converted
        # value keeps no exact copy of them).
        text = _decode(raw, _encodings(dataset))
    else:
        # Already converted by pydicom (or set by code): its decoding stands, minus any
        # escape sequence it left in.
        value = dataset.get(keyword)
        text = "" if value is None else str(value)
    groups = [_clean(group) for group in text.split("=")]
    while groups and not groups[-1].strip("^ "):
        groups.pop()
    return tuple(groups)


def person_name_text(dataset: Dataset, keyword: str = "PatientName") -> str:
    """The groups of :func:`person_name_groups` joined by ``=`` (DICOM PN text form)."""
    return "=".join(person_name_groups(dataset, keyword))


def _encodings(dataset: Dataset) -> list[str]:
    value = dataset.get("SpecificCharacterSet")
    terms = (
        [str(v) for v in value]
        if isinstance(value, Sequence) and not isinstance(value, str)
        else ([str(value)] if value else [])
    )
    if found := undeclared_character_set(dataset):
        terms = [found]  # non-ASCII text no Specific Character Set declares, or mislabelled
    try:
        return convert_encodings(terms or None)
    except Exception:  # an unknown term: the default repertoire, escapes decode below
        return convert_encodings(None)


def _decode(raw: bytes, encodings: list[str]) -> str:
    """The whole value: pydicom first; where it left an escape sequence, fragment by
    fragment here. Delimiters are split on in the decoded text, where a ``^`` or ``=``
    is one (in the bytes, 0x5E and 0x3D also occur inside JIS X 0208 characters)."""
    text = decode_bytes(raw, encodings, PN_DELIMS)
    if "\x1b" not in text:
        return text
    return "".join(_decode_fragment(f, encodings) for f in _FRAGMENTS.findall(raw))


def _decode_fragment(fragment: bytes, encodings: list[str]) -> str:
    """One run of bytes under one code set: the escape sequence picks the codec."""
    if not fragment.startswith(ESC):
        return fragment.decode(encodings[0], errors="replace")
    size = 4 if fragment.startswith((b"\x1b$(", b"\x1b$)")) else 3
    codec = CODES_TO_ENCODINGS.get(fragment[:size])
    if codec is None:
        logger.warning("a person name holds an unknown ISO 2022 escape sequence; dropped")
        return _ESCAPE.sub("", fragment.decode("latin_1"))
    if codec in _ISO2022_CODECS:
        return fragment.decode(codec, errors="replace")
    body = fragment[size:]
    if codec in _GB2312:
        codec = "gb2312"  # G1 designation: the bytes that follow are GR (EUC form)
    # A delimiter switches back to the first character set (PS3.5 6.1.2.5.3).
    cut = next((i for i, b in enumerate(body) if b in PN_DELIMS), len(body))
    return body[:cut].decode(codec, errors="replace") + body[cut:].decode(
        encodings[0], errors="replace"
    )


def _clean(text: str) -> str:
    """No escape sequence or control character survives into a name."""
    return _CONTROL.sub("", _ESCAPE.sub("", text)).strip()
