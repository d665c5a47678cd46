"""The one rule for model.yaml text that becomes a DICOM value in the SEG and SR.

A label name is a SegmentLabel and SR text; a label's concept and category meanings are
CodeMeanings (LO), their schemes Coding Scheme Designators (SH); the model's name and
version are the AlgorithmName, Manufacturer's Model Name and AlgorithmVersion (LO). A
backslash is DICOM's value delimiter (``a\\b`` is two values of a one-value attribute),
and control or format characters (NUL, newlines, a right-to-left override) would be
written into the objects and shown in the console. highdicom refuses a CodeMeaning over
64 characters, so such a manifest was accepted and every SEG and SR of it failed at the
end of each run; now it is refused where it is read, naming the field.

Lengths are counted in UTF-8 bytes: DICOM counts LO's 64 and SH's 16 in characters, but
dciodvfy counts the bytes of the encoded value (a 64-character meaning holding "αβγ 肝臓"
is 71 bytes and an error there), as do fixed-width PACS database columns; UTF-8 is the
widest encoding radserve writes for most scripts. :func:`fit` cuts radserve's own text
(a long label name as SegmentLabel) the same way.
"""

from __future__ import annotations

LO_MAX_BYTES = 64  # Long String (CodeMeaning, AlgorithmName, AlgorithmVersion, labels)
SH_MAX_BYTES = 16  # Short String (Coding Scheme Designator)


def dicom_text(value: str, what: str, *, max_bytes: int | None = None) -> str:
    """``value`` if it can be one DICOM text value (printable, no backslash, not empty,
    at most ``max_bytes`` as UTF-8); else ValueError naming ``what``."""
    if not value or not value.isprintable() or "\\" in value:
        raise ValueError(
            f"{what} {value[:80]!r} must be printable text without a backslash "
            "(no control or format characters such as NUL or U+202E)"
        )
    if max_bytes is not None and (size := len(value.encode())) > max_bytes:
        raise ValueError(
            f"{what} {value[:80]!r} is {size} bytes as UTF-8; a DICOM value of this kind "
            f"holds at most {max_bytes} (counted in bytes: dciodvfy and PACS databases do)"
        )
    return value


def cut_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` as UTF-8, never inside a character."""
    return text.encode()[:max_bytes].decode(errors="ignore")


def fit(text: str, max_bytes: int = LO_MAX_BYTES) -> str:
    """``text`` cut to ``max_bytes`` as UTF-8, ending in ``~`` when cut (never inside a
    character)."""
    if len(text.encode()) <= max_bytes:
        return text
    return cut_utf8(text, max_bytes - 1) + "~"


__all__ = ["LO_MAX_BYTES", "SH_MAX_BYTES", "cut_utf8", "dicom_text", "fit"]
