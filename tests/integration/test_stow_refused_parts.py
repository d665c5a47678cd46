"""STOW-RS requests refused in part or whole for their framing, against the real server
(uvicorn on loopback, httpx); found by the DICOMweb user trial of 2026-12-07.

- A Content-Type that gives a parameter twice (``boundary=BB; boundary=CC``) is 400
  saying so. Before, the body check read the first boundary and the parser the last:
  400 "the body ends before its first delimiter ... cut short", or, the other way
  round, "no delimiter of the boundary ('CC')", neither the fault.
- Many refused parts that name no instance (empty parts): the first
  ``LISTED_UNNAMED_REFUSALS`` are answered each, the rest counted on one summary item,
  so the answer no longer grows with the part count (99,999 empty parts, a 4.3 MB body,
  were answered with 21.9 MB, one Failed SOP item each); a refused instance with a SOP
  Instance UID is still answered with its own item."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from tests.factories.dicomweb import FAILED, failures, related, stow
from tests.factories.service import auth, live_server, make_study, settings_for

from radserve.gateway.dicomweb.stow import LISTED_UNNAMED_REFUSALS, UNLISTED_CODE

SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"
NOT_DICOM, SOP_CLASS_NOT_SUPPORTED = 0xC000, 0x0122
REASON_CODE, REASON_TEXT = "00091001", "00091002"  # radserve's private block (0009,10xx)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("stow-refused-parts")
    with live_server(settings_for(root), warm=False) as live:
        yield live


def post(server: dict[str, Any], body: bytes, content_type: str) -> Any:
    headers = {"Content-Type": content_type, **auth(server["submit"])}
    return server["client"].post("/dicomweb/studies", content=body, headers=headers)


@pytest.mark.parametrize(
    ("params", "twice"),
    [
        ('type="application/dicom"; boundary={b}; boundary=CC', "boundary"),
        ('type="application/dicom"; boundary=CC; boundary={b}', "boundary"),
        ('boundary={b}; type="application/dicom"; Boundary={b}', "boundary"),
        ('type="application/dicom"; boundary={b}; type="application/dicom"', "type"),
    ],
)
def test_a_content_type_giving_a_parameter_twice_is_400_saying_so(
    server: dict[str, Any], params: str, twice: str
) -> None:
    body, content_type = related([(b"", "application/dicom")])
    boundary = content_type.split("boundary=")[1]
    r = post(server, body, "multipart/related; " + params.format(b=boundary))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    assert f"the Content-Type gives '{twice}' twice" in error["message"], error


def unsupported_instances(tmp_path: Path, count: int) -> list[tuple[bytes, str | None]]:
    """``count`` instances of a SOP class radserve does not read (0x0122, with UIDs)."""
    parts: list[tuple[bytes, str | None]] = []
    for path in make_study(tmp_path / "study")[:count]:
        ds = pydicom.dcmread(path)
        ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = SR_3D
        buffer = io.BytesIO()
        ds.save_as(buffer, enforce_file_format=True)
        parts.append((buffer.getvalue(), "application/dicom"))
    return parts


def private(item: dict[str, Any], tag: str) -> str:
    return str(item[tag]["Value"][0])


@pytest.mark.parametrize("empty", [LISTED_UNNAMED_REFUSALS + 1, 5 * LISTED_UNNAMED_REFUSALS])
def test_empty_parts_past_the_listed_ones_are_counted_on_one_item(
    server: dict[str, Any], tmp_path: Path, empty: int
) -> None:
    named = unsupported_instances(tmp_path, 2)
    r = stow(server, [(b"", "application/dicom")] * empty + named)
    assert r.status_code == 409, r.text[:300]  # nothing stored
    answered = failures(r)
    listed = LISTED_UNNAMED_REFUSALS
    # the first parts each, then every named instance, then one item for the rest
    assert answered[:listed] == [(None, NOT_DICOM)] * listed
    uids = [str(pydicom.dcmread(io.BytesIO(data)).SOPInstanceUID) for data, _ in named]
    assert answered[listed:-1] == [(uid, SOP_CLASS_NOT_SUPPORTED) for uid in uids]
    assert answered[-1] == (None, NOT_DICOM)
    assert len(answered) == listed + len(named) + 1
    items = r.json()[FAILED]["Value"]
    assert private(items[0], REASON_CODE) == "not_dicom"
    summary = items[-1]
    assert private(summary, REASON_CODE) == UNLISTED_CODE
    more = empty - listed
    assert private(summary, REASON_TEXT).startswith(f"{more} more part(s) not stored"), summary
    assert f"parts {listed + 1} to {empty}: {more} not_dicom (0xC000)" in private(
        summary, REASON_TEXT
    )
    # bounded: an item per listed part (about 220 bytes), whatever the part count
    assert len(r.content) < 300 * (listed + len(named) + 1), len(r.content)


def test_the_answer_does_not_grow_with_the_number_of_empty_parts(server: dict[str, Any]) -> None:
    sizes = []
    for empty in (2 * LISTED_UNNAMED_REFUSALS, 20 * LISTED_UNNAMED_REFUSALS):
        r = stow(server, [(b"", None)] * empty)
        assert r.status_code == 409, r.text[:300]
        assert len(r.json()[FAILED]["Value"]) == LISTED_UNNAMED_REFUSALS + 1
        sizes.append(len(r.content))
    # the same items; only the summary's count and last part number have more digits
    assert 0 <= sizes[1] - sizes[0] <= 8, sizes
