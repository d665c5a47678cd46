"""multipart/related helpers: Content-Type and Accept parsing, reading request bodies
(preamble, epilogue, transport padding, LF-only, any chunking), the response body."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radserve.gateway.dicomweb.multipart import (
    MAX_PART_HEADERS,
    MAX_PREAMBLE,
    MalformedMultipartError,
    RelatedParser,
    related_boundary,
    related_parts,
)
from radserve.media_types import MediaType, accepted_types
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
        ("application/dicom", UnsupportedMediaError, "'application/dicom' is not supported"),
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


# --- reading: RFC 2046 bodies as clients really send them -------------------------------
def parse(body: bytes, boundary: str = "bnd", step: int | None = None) -> list[tuple[dict, bytes]]:
    """The (headers, bytes) of each part, the body fed ``step`` bytes at a time."""
    parser = RelatedParser(boundary)
    step = step or max(1, len(body))
    try:
        for i in range(0, len(body), step):
            parser.feed(body[i : i + step])
        parser.finish()
        out = []
        for part in parser.parts:
            part.file.seek(0)
            out.append((part.headers, part.file.read()))
        return out
    finally:
        parser.close()


DICOM = {"content-type": "application/dicom"}


@pytest.mark.parametrize("step", [1, 2, 7, 64, None])
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            b"This is a preamble.\r\n--bnd\r\nContent-Type: application/dicom\r\n\r\nA\r\n"
            b"--bnd--\r\nand an epilogue\r\n--bnd\r\n\r\nnot a part",
            [(DICOM, b"A")],
            id="preamble+epilogue",
        ),
        pytest.param(
            b"--bnd \t \r\nContent-Type: application/dicom\r\n\r\nA\r\n--bnd\t\r\n"
            b"Content-Type: application/dicom\r\n\r\nB\r\n--bnd--",
            [(DICOM, b"A"), (DICOM, b"B")],
            id="transport-padding",
        ),
        pytest.param(
            b"pre\n--bnd\nContent-Type: application/dicom\n\nA\r\n\n--bnd\n"
            b"content-type:application/dicom\n\nB\n--bnd--\n",
            [(DICOM, b"A\r\n"), (DICOM, b"B")],
            id="lf-only",
        ),
        pytest.param(
            b"--bnd\r\nContent-Type: application/dicom;\r\n transfer-syntax=1.2\r\n\r\n"
            b"\r\n--bndX\r\n--bn\r\n--bnd\r\n\r\n\r\n--bnd--",
            [
                ({"content-type": "application/dicom; transfer-syntax=1.2"}, b"\r\n--bndX\r\n--bn"),
                ({}, b""),
            ],
            id="folded-header+boundary-lookalikes+empty-part",
        ),
        pytest.param(
            b"\r\n\r\n--bnd\r\n\r\n--bnd\r\n\r\nx--bnd--\r\n--bnd--",
            [({}, b"--bnd\r\n\r\nx--bnd--")],
            id="delimiter-only-at-line-start",
        ),
    ],
)
def test_reads_what_rfc_2046_allows(body: bytes, expected: list, step: int | None) -> None:
    assert parse(body, step=step) == expected


def test_random_bodies_read_back_exactly_at_any_chunking() -> None:
    """Seeded bodies with binary parts full of CR/LF/hyphens and boundary prefixes,
    random preambles, epilogues, padding and line endings, fed in random chunks."""
    rng = random.Random(20261201)
    alphabet = b"\r\n-bnd \tX\x00\xff"
    for _ in range(300):
        newline = rng.choice([b"\r\n", b"\n"])
        boundary = rng.choice(["bnd", "b-" + "x" * rng.randint(1, 60), "a'()+_,-./:=?"])
        dash = b"--" + boundary.encode()
        parts = []
        for _ in range(rng.randint(1, 4)):
            data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
            if newline + dash in newline + data:  # RFC 2046: not in a part's lines
                data = data.replace(dash, b"#")
            parts.append(({"content-type": "application/dicom"}, data))
        preamble = bytes(rng.choice(b"abc \r\n") for _ in range(rng.randint(0, 50)))
        preamble = (preamble + newline) if preamble else b""
        body = preamble
        for _, data in parts:
            pad = rng.choice([b"", b" ", b"\t \t"])
            body += dash + pad + newline + b"Content-Type: application/dicom" + newline
            body += newline + data + newline
        body += dash + b"--" + rng.choice([b"", newline, newline + b"epilogue" + dash])
        assert parse(body, boundary, step=rng.randint(1, 80)) == parts, body


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"--bnd\r\nContent-Type: application/dicom\r\n\r\nhalf a file", "without its close"),
        (b"--bnd\r\nContent-Type: application/dicom\r\n", "without its close"),
        (b"no delimiter here at all", "before its first delimiter"),
        (b"x" * (MAX_PREAMBLE + 100), "no multipart delimiter"),
        (b"x--bnd\r\n\r\nA\r\n--bndY", "before its first delimiter"),  # no line start
        (b"--bnd\r\nno colon in this line\r\n\r\nA\r\n--bnd--", "not 'Name: value'"),
        (b"--bnd\r\n" + b"X-Long: " + b"y" * (MAX_PART_HEADERS + 10), "headers exceed"),
        (
            b"--bnd\r\nX-Long: " + b"y" * MAX_PART_HEADERS + b"\r\n\r\nA\r\n--bnd--",
            "headers exceed",
        ),
    ],
)
def test_refuses_bodies_it_cannot_read(body: bytes, match: str) -> None:
    with pytest.raises(MalformedMultipartError, match=match):
        parse(body, step=4096)


@pytest.mark.parametrize("boundary", ["", "é", "x" * 500])
def test_refuses_unusable_boundaries(boundary: str) -> None:
    with pytest.raises(MalformedMultipartError, match="boundary"):
        RelatedParser(boundary)


def test_memory_stays_bounded_for_a_large_part() -> None:
    """A 40 MiB part streams into a spooled file that went to disk; the parser keeps
    only a delimiter's length of it."""
    parser = RelatedParser("bnd")
    parser.feed(b"--bnd\r\nContent-Type: application/dicom\r\n\r\n")
    chunk = bytes(range(256)) * 256
    for _ in range(640):
        parser.feed(chunk)
        assert len(parser._buffer) < 64
    parser.feed(b"\r\n--bnd--\r\n")
    parser.finish()
    (part,) = parser.parts
    assert part.file._rolled  # type: ignore[attr-defined]
    assert part.file.tell() == 640 * len(chunk)
    parser.close()
