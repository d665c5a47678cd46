"""multipart/related helpers: Content-Type and Accept parsing, the response body."""

from __future__ import annotations

from pathlib import Path

import pytest

from radserve.api.multipart_related import (
    MalformedMultipartError,
    MediaType,
    accepted_types,
    related_boundary,
    related_parts,
)
from radserve.service.errors import UnsupportedMediaError

ROOT = ("application/dicom",)


@pytest.mark.parametrize(
    ("header", "boundary"),
    [
        ('multipart/related; type="application/dicom"; boundary=abc', "abc"),
        ('Multipart/Related;type=application/dicom;boundary="a;b=c"', "a;b=c"),
        ("multipart/related; boundary=xyz", "xyz"),  # no type: application/dicom
    ],
)
def test_related_boundary(header: str, boundary: str) -> None:
    assert related_boundary(header, root_types=ROOT) == (boundary, "application/dicom")


@pytest.mark.parametrize(
    ("header", "error", "match"),
    [
        (None, UnsupportedMediaError, r"\(none\) is not supported"),
        ("application/dicom", UnsupportedMediaError, "application/dicom is not supported"),
        ("multipart/form-data; boundary=x", UnsupportedMediaError, "multipart/form-data"),
        ('multipart/related; type="application/dicom+json"; boundary=x', UnsupportedMediaError,
         "'application/dicom\\+json' is not supported"),
        ('multipart/related; type="application/dicom"', MalformedMultipartError, "no boundary"),
    ],
)  # fmt: skip
def test_related_boundary_refusals(header: str | None, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        related_boundary(header, root_types=ROOT)


def test_accept_ranges_drop_q0_and_default_to_anything() -> None:
    assert accepted_types(None) == [MediaType("*/*")]
    ranges = accepted_types('multipart/related; type="application/dicom", */*;q=0, image/png')
    assert [m.type for m in ranges] == ["multipart/related", "image/png"]
    assert ranges[0].params == {"type": "application/dicom"}


def test_related_parts_frame_each_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A" * 5)
    b.write_bytes(b"B\r\n--x")
    body = b"".join(related_parts([(a, "1.2.840.10008.1.2.1"), (b, "1.2")], "bnd", chunk=2))
    assert body == (
        b"--bnd\r\nContent-Type: application/dicom; transfer-syntax=1.2.840.10008.1.2.1\r\n\r\n"
        b"AAAAA\r\n--bnd\r\nContent-Type: application/dicom; transfer-syntax=1.2\r\n\r\n"
        b"B\r\n--x\r\n--bnd--\r\n"
    )
