"""Target (f): a QIDO-RS query string (``GET /dicomweb/studies?...``) through
:func:`~radserve.gateway.dicomweb.qido.parse_query`, then each match key through
:func:`~radserve.gateway.dicomweb.qido.matches` against the attributes of a phantom
instance, as a search matches every indexed result. radserve has no C-FIND SCP: QIDO-RS
is its only query door.

Input layout: byte 0 chooses the level; the rest is the query string."""

from __future__ import annotations

import functools
import io
from urllib.parse import parse_qsl

import pydicom
from pydicom.datadict import tag_for_keyword
from pydicom.dataset import Dataset

from radserve.gateway.dicomweb.qido import _values, matches, parse_query
from tests.fuzz.invariant import refusals_only
from tests.fuzz.targets import _phantom

COVERED = ("radserve.gateway.dicomweb.qido",)
LEVELS = ("study", "series", "instance")


@functools.cache
def _header() -> Dataset:
    ds = pydicom.dcmread(io.BytesIO(_phantom.instances()[0]), stop_before_pixels=True)
    ds.PatientName = (
        "Aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa^Bbbbbbbbbbbbbbbbbbbbbbbbbbbbb"  # PN: 64/group
    )
    ds.StudyDescription = "CT CHEST ABDOMEN PELVIS WITH CONTRAST"
    ds.StudyDate, ds.StudyTime = "20240115", "101530.25"
    return ds


def seeds() -> list[bytes]:
    queries = (
        "PatientName=aaa*&limit=10&offset=0",
        "StudyDate=20240101-20241231&includefield=all&fuzzymatching=false",
        "PatientID=PHANTOM&00100010=A?a*",
        "StudyTime=1000-1200&Modality=CT&SeriesNumber=1",
        f"StudyInstanceUID={_phantom.STUDY_UID},1.2.3&includefield=00100020,StudyDescription",
        "AccessionNumber=&StudyDescription=*CHEST*",
    )
    return [bytes([i % 3]) + q.encode() for i, q in enumerate(queries)]


def one_input(data: bytes) -> None:
    if not data:
        return
    text = data[1:].decode("utf-8", "replace")
    items = parse_qsl(text, keep_blank_values=True)  # as Starlette splits a query string
    with refusals_only():
        query = parse_query(items, LEVELS[data[0] % 3])
        header = _header()
        for keyword, wanted in query.filters.items():
            element = header.get(tag_for_keyword(keyword))  # by tag: the element, not its value
            matches(_values(element), keyword, wanted)
