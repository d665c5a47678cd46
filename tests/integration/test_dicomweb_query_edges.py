"""QIDO-RS at the edges of its match keys, against the real server (uvicorn on loopback,
httpx) holding the results of one job: ``includefield`` takes a sequence and answers it
from the stored result's header (it was refused "a sequence: radserve does not match on
it"), and an attribute outside the few read for every search is answered (it was a
500); a number key that no value of its VR can be (``nan``, ``1e999``, a US past 65535)
and a bulk-data key (Pixel Data) are 400, as the conformance statement says of a
malformed number (each answered 200 with nothing, while ``NumberOfFrames=abc`` was 400).
Found by the DICOMweb user trial of 2026-12-07."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from tests.factories.dicomweb import dicom_parts, job_of, stow
from tests.factories.service import auth, live_server, make_study, settings_for, wait_job

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SEGMENT_SEQUENCE = "00620002"
SOP_CLASS, SOP_INSTANCE = "00080016", "00080018"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("dicomweb-query-edges")
    with live_server(settings_for(root)) as live:
        files = make_study(root / "study")
        r = stow(live, dicom_parts(files))
        assert r.status_code == 200, r.text
        job = wait_job(live["client"], job_of(r), live["submit"])
        assert job["state"] == "succeeded", job
        result_dir = Path(live["service"].jobs.get(job["id"]).result_path or "")
        headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in result_dir.glob("*.dcm")]
        segs = {str(h.SOPInstanceUID): h for h in headers if h.SOPClassUID == SEG}
        assert segs, sorted(result_dir.iterdir())  # organs and findings
        yield {**live, "segs": segs, "seg": segs[min(segs)]}


def search(server: dict[str, Any], query: str) -> Any:
    return server["client"].get(f"/dicomweb/instances?{query}", headers=auth(server["read"]))


def uids(answer: list[dict[str, Any]]) -> list[str]:
    return [i[SOP_INSTANCE]["Value"][0] for i in answer]


@pytest.mark.parametrize("name", ["SegmentSequence", SEGMENT_SEQUENCE])
def test_includefield_takes_a_sequence_and_answers_it_from_the_stored_header(
    server: dict[str, Any], name: str
) -> None:
    r = search(server, f"includefield={name}")
    assert r.status_code == 200, r.text
    answer = r.json()
    segs = [i for i in answer if i[SOP_CLASS]["Value"] == [SEG]]
    assert sorted(uids(segs)) == sorted(server["segs"])
    for seg in segs:
        wanted = pydicom.Dataset()
        wanted.SegmentSequence = server["segs"][seg[SOP_INSTANCE]["Value"][0]].SegmentSequence
        assert seg[SEGMENT_SEQUENCE] == wanted.to_json_dict()[SEGMENT_SEQUENCE]
        assert seg[SEGMENT_SEQUENCE]["vr"] == "SQ" and seg[SEGMENT_SEQUENCE]["Value"]
    # the SR has no Segment Sequence: nothing of it in its answer
    others = [i for i in answer if i not in segs]
    assert others and all(SEGMENT_SEQUENCE not in i for i in others)


def test_includefield_of_an_attribute_outside_the_searched_ones_is_answered(
    server: dict[str, Any],
) -> None:
    """ContentLabel is read on demand from the file (before, pydicom's value and not its
    element came back: a 500)."""
    r = search(server, "includefield=ContentLabel&SOPClassUID=" + SEG)
    assert r.status_code == 200, r.text
    assert {i["00700080"]["Value"][0] for i in r.json()} == {
        str(h.ContentLabel) for h in server["segs"].values()
    }


def test_matching_on_a_sequence_is_400_with_a_message_about_matching(
    server: dict[str, Any],
) -> None:
    r = search(server, "SegmentSequence=x")
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "does not match on it" in message and "includefield=SegmentSequence" in message


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("NumberOfFrames=nan", "NumberOfFrames must be a number, not 'nan'"),
        ("NumberOfFrames=inf", "NumberOfFrames must be a number, not 'inf'"),
        ("NumberOfFrames=1e999", "NumberOfFrames (IS) must be a whole number"),
        ("NumberOfFrames=2147483648", "NumberOfFrames (IS) must be from -2147483648 to 2147483647"),
        ("NumberOfFrames=abc", "NumberOfFrames must be a number, not 'abc'"),
        ("Rows=99999999999999999999", "Rows (US) must be from 0 to 65535"),
        ("Rows=65536", "Rows (US) must be from 0 to 65535"),
        ("Rows=-1", "Rows (US) must be from 0 to 65535"),
        ("Rows=" + "9" * 5000, "Rows (US) must be from 0 to 65535"),
        ("Columns=2.5", "Columns (US) must be a whole number"),
        ("SliceThickness=1e999", "SliceThickness (DS) must be a finite number"),
        ("PixelData=x", "PixelData is bulk data (VR OB or OW): radserve does not match on it"),
        ("7FE00010=x", "PixelData is bulk data (VR OB or OW): radserve does not match on it"),
        ("PixelData=", "PixelData is bulk data"),
        ("IconImageSequence=", "IconImageSequence is a sequence"),
        ("includefield=PixelData", "PixelData is bulk data (VR OB or OW): a QIDO-RS answer"),
        ("includefield=Rows,7FE00010", "PixelData is bulk data"),
        ("includefield=Rows,EncapsulatedDocument", "EncapsulatedDocument is bulk data (VR OB)"),
    ],
)  # fmt: skip
def test_a_number_no_value_of_its_vr_can_be_and_a_bulk_data_key_are_400(
    server: dict[str, Any], query: str, said: str
) -> None:
    r = search(server, query)
    assert r.status_code == 400, (query, r.text[:300])
    assert r.json()["error"]["code"] == "invalid_request"
    assert said in r.json()["error"]["message"], r.json()


def test_numbers_within_their_vr_still_match(server: dict[str, Any]) -> None:
    seg = server["seg"]
    for query in (
        f"NumberOfFrames={seg.NumberOfFrames}",
        f"NumberOfFrames=+{seg.NumberOfFrames}",
        f"Rows={seg.Rows}&Columns=%20{seg.Columns}%20",
    ):
        r = search(server, query)
        assert r.status_code == 200, (query, r.text)
        assert seg.SOPInstanceUID in uids(r.json()), query
    for query in ("Rows=65535", "NumberOfFrames=-2147483648", "SliceThickness=0.5"):
        r = search(server, query)
        assert r.status_code == 200 and r.json() == [], (query, r.text)
