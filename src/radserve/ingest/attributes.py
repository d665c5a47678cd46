"""Reading the DICOM attributes the priority rules match from a study's headers.

The classes and rules themselves are :mod:`radserve.domain.priority`; the scheduler
takes the attributes as plain strings. The values (patient location, department, ...)
are patient context: they are read here and never logged. Headers are read through
:func:`radserve.ingest.headers.read_header`, the one header parser.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydicom.dataset import Dataset

from radserve.ingest.headers import read_header


def priority_attributes(ds: Dataset, keywords: Iterable[str]) -> dict[str, str]:
    """``keywords`` read from ``ds``, or from its Request Attributes Sequence when absent
    at the top level (modalities copy the order's attributes there)."""
    out: dict[str, str] = {}
    items = list(getattr(ds, "RequestAttributesSequence", None) or [])
    for keyword in keywords:
        for source in (ds, *items):
            value = getattr(source, keyword, None)
            if value not in (None, ""):
                out[keyword] = str(value)
                break
    return out


def read_priority_attributes(path: Path, keywords: Iterable[str]) -> dict[str, str]:
    """The attributes of the first readable DICOM file at ``path`` (a file or a folder).

    Header only. Archives are not opened: callers that hold a dataset (the DICOM
    gateway) use :func:`priority_attributes` directly. Nothing readable -> ``{}``.
    """
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        try:
            ds = read_header(file)
        except Exception:  # not DICOM, or unreadable: try the next file
            continue
        return priority_attributes(ds, keywords)
    return {}


__all__ = ["priority_attributes", "read_priority_attributes"]
