"""DICOMweb against the real server (uvicorn on loopback) with an independent client,
``dicomweb-client``, and with bodies framed the ways RFC 2046 allows (preamble,
epilogue, transport padding, LF-only line endings)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydicom
import pytest
from dicomweb_client import DICOMwebClient
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.gateway.dicomweb.qido import MORE_WARNING, QidoSearch, parse_query
from radserve.service import Service

REFERENCED = "00081199"
SOP_INSTANCE = "00081155"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("dicomweb-clients")
    service = Service(
        settings_for(root, dicomweb__quiet_s=0.5, results__secondary_capture_key_images=True)
    )
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        submit, read = create_key(service.store, "submit"), create_key(service.store, "read")
        yield {
            "url": srv.url,
            "client": c,
            "service": service,
            "submit": submit,
            "read": read,
            "dw": DICOMwebClient(f"{srv.url}/dicomweb", headers=auth(read)),
        }


def uids(paths: list[Path]) -> list[str]:
    return sorted(str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in paths)


def referenced(response: dict[str, Any]) -> list[str]:
    return sorted(i[SOP_INSTANCE]["Value"][0] for i in response[REFERENCED].get("Value", []))


def job_of(response: httpx.Response) -> str:
    return response.headers["link"].split("</v1/jobs/")[1].split(">")[0]


@pytest.mark.parametrize(
    "framing", ["preamble-epilogue", "transport-padding", "lf-only", "all-of-them"]
)
def test_stow_reads_every_framing_rfc_2046_allows(
    server: dict[str, Any], tmp_path: Path, framing: str
) -> None:
    files = make_study(tmp_path / "study", n_slices=4)
    boundary = f"b{uuid.uuid4().hex}"
    nl = b"\n" if framing in ("lf-only", "all-of-them") else b"\r\n"
    pad = b" \t " if framing in ("transport-padding", "all-of-them") else b""
    preamble = epilogue = b""
    if framing in ("preamble-epilogue", "all-of-them"):
        preamble = b"This is a multi-part message in MIME format." + nl
        epilogue = nl + b"This is the epilogue. --" + boundary.encode() + nl
    body = preamble
    for path in files:
        body += b"--" + boundary.encode() + pad + nl + b"Content-Type: application/dicom" + nl
        body += nl + path.read_bytes() + nl
    body += b"--" + boundary.encode() + b"--" + epilogue
    r = server["client"].post(
        "/dicomweb/studies",
        content=body,
        headers={
            "Content-Type": f'multipart/related; type="application/dicom"; boundary={boundary}',
            **auth(server["submit"]),
        },
    )
    assert r.status_code == 200, r.text
    assert referenced(r.json()) == uids(files)
    job = wait_job(server["client"], job_of(r), server["submit"])
    assert job["state"] == "succeeded", job


def test_dicomweb_client_stores_a_study_and_reads_its_results(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """dicomweb-client's store_instances (its own multipart framing) against radserve,
    then its WADO-RS retrieval of what the job wrote."""
    files = make_study(tmp_path / "study")
    datasets = [pydicom.dcmread(p) for p in files]
    study = str(datasets[0].StudyInstanceUID)
    links: list[str] = []
    client = DICOMwebClient(
        f"{server['url']}/dicomweb",
        headers=auth(server["submit"]),
        callback=lambda r, *_, **__: links.append(r.headers.get("link", "")),
    )
    response = client.store_instances(datasets, study_instance_uid=study)
    stored = sorted(str(i.ReferencedSOPInstanceUID) for i in response.ReferencedSOPSequence)
    assert stored == uids(files)
    assert not response.get("FailedSOPSequence")

    (link,) = links
    job = wait_job(server["client"], link.split("</v1/jobs/")[1].split(">")[0], server["submit"])
    assert job["state"] == "succeeded", job
    metadata = server["dw"].retrieve_study_metadata(study)
    classes = {m["00080016"]["Value"][0] for m in metadata}
    assert "1.2.840.10008.5.1.4.1.1.66.4" in classes  # the SEG
    instances = server["dw"].retrieve_study(study)
    assert sorted(str(d.SOPInstanceUID) for d in instances) == sorted(
        m["00080018"]["Value"][0] for m in metadata
    )


# --- QIDO-RS -------------------------------------------------------------------------------
SEG = "1.2.840.10008.5.1.4.1.1.66.4"
SR_3D = "1.2.840.10008.5.1.4.1.1.88.34"
SC = "1.2.840.10008.5.1.4.1.1.7"
STUDIES = (
    {"PatientID": "QIDO-A", "PatientName": "Alpha^Anna", "StudyDate": "20240115",
     "StudyDescription": "CT chest", "AccessionNumber": "ACC-1"},
    {"PatientID": "QIDO-B", "PatientName": "Beta^Bert", "StudyDate": "20250620",
     "StudyDescription": "CT abdomen", "AccessionNumber": "ACC-2"},
)  # fmt: skip


@pytest.fixture(scope="module")
def held(server: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two studies stored through STOW-RS whose jobs succeeded: their Study UIDs."""
    study_uids = []
    for n, extra in enumerate(STUDIES):
        files = make_study(tmp_path_factory.mktemp(f"qido{n}"), extra=extra)
        body, boundary = b"", "qido-boundary"
        for path in files:
            body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
            body += path.read_bytes() + b"\r\n"
        body += f"--{boundary}--\r\n".encode()
        r = server["client"].post(
            "/dicomweb/studies",
            content=body,
            headers={
                "Content-Type": f"multipart/related; boundary={boundary}",
                **auth(server["submit"]),
            },
        )
        assert r.status_code == 200, r.text
        job = wait_job(server["client"], job_of(r), server["submit"])
        assert job["state"] == "succeeded", job
        study_uids.append(str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID))
    return study_uids


def value(item: dict[str, Any], keyword: str) -> Any:
    """The first value of ``keyword`` in a DICOM JSON result, or None."""
    element = item.get(f"{pydicom.datadict.tag_for_keyword(keyword):08X}", {})
    values = element.get("Value", [None])
    return values[0]


def ours(results: list[dict[str, Any]], held: list[str]) -> list[dict[str, Any]]:
    return [r for r in results if value(r, "StudyInstanceUID") in held]


def test_qido_studies_match_as_ps3_4_says(server: dict[str, Any], held: list[str]) -> None:
    dw = server["dw"]
    studies = ours(dw.search_for_studies(), held)
    assert [value(s, "StudyInstanceUID") for s in studies] == held[::-1]  # newest first
    a = next(s for s in studies if value(s, "PatientID") == "QIDO-A")
    assert value(a, "StudyDate") == "20240115" and value(a, "AccessionNumber") == "ACC-1"
    assert value(a, "PatientName") == {"Alphabetic": "Alpha^Anna"}
    modalities = a["00080061"]["Value"]
    assert "SEG" in modalities and "SR" in modalities
    assert value(a, "NumberOfStudyRelatedSeries") == len(
        {m["0020000E"]["Value"][0] for m in dw.retrieve_study_metadata(held[0])}
    )
    assert value(a, "NumberOfStudyRelatedInstances") == len(dw.retrieve_study_metadata(held[0]))
    assert value(a, "RetrieveURL").endswith(f"/dicomweb/studies/{held[0]}")
    assert value(a, "InstanceAvailability") == "ONLINE"

    def find(**filters: Any) -> list[str]:
        found = dw.search_for_studies(search_filters=filters)
        return [value(s, "StudyInstanceUID") for s in ours(found, held)]

    assert find(PatientID="QIDO-B") == [held[1]]
    assert find(PatientID="QIDO-*") == held[::-1]  # wildcard
    assert find(PatientID="qido-a") == []  # LO: case-sensitive
    assert find(PatientName="alpha*") == [held[0]]  # PN: case-insensitive
    assert find(StudyInstanceUID=f"{held[0]},1.2.3.4") == [held[0]]  # UID list
    assert find(StudyDate="20240101-20241231") == [held[0]]  # range
    assert find(StudyDate="20250101-") == [held[1]]
    assert find(StudyDate="-20250620") == held[::-1]
    assert find(StudyDate="20250620") == [held[1]]
    assert find(ModalitiesInStudy="SEG") == held[::-1]
    assert find(ModalitiesInStudy="MR") == []
    assert find(**{"00081030": "CT abd*"}) == [held[1]]  # a tag as the key
    assert find(AccessionNumber="ACC-?") == held[::-1]

    # limit and offset page through the results; get_remaining follows them to the end
    everything = dw.search_for_studies()
    first, second = dw.search_for_studies(limit=1), dw.search_for_studies(limit=1, offset=1)
    assert [*first, *second] == everything[:2]
    assert dw.search_for_studies(limit=1, get_remaining=True) == everything
    assert dw.search_for_studies(offset=len(everything)) == []

    # includefield adds attributes; all adds every one radserve reads
    (b,) = dw.search_for_studies(search_filters={"PatientID": "QIDO-B"}, fields=["00081030"])
    assert value(b, "StudyDescription") == "CT abdomen"
    (b,) = dw.search_for_studies(search_filters={"PatientID": "QIDO-B"}, fields=["all"])
    assert value(b, "PatientSex") is not None and value(b, "Modality") is not None


def test_qido_series_and_instances_lead_to_wado(server: dict[str, Any], held: list[str]) -> None:
    dw, study = server["dw"], held[0]
    series = dw.search_for_series(study)
    by_modality = {value(s, "Modality"): s for s in series}
    assert {"SEG", "SR"} <= set(by_modality)
    assert all(value(s, "StudyInstanceUID") == study for s in series)
    seg = by_modality["SEG"]
    seg_series = value(seg, "SeriesInstanceUID")
    seg_meta = dw.retrieve_series_metadata(study, seg_series)
    assert value(seg, "NumberOfSeriesRelatedInstances") == len(seg_meta)
    assert value(seg, "RetrieveURL").endswith(f"/studies/{study}/series/{seg_series}")
    assert [value(s, "SeriesInstanceUID") for s in dw.search_for_series(
        study, search_filters={"Modality": "SEG"})] == [seg_series]  # fmt: skip

    instances = dw.search_for_instances(study, seg_series)
    assert sorted(value(i, "SOPInstanceUID") for i in instances) == sorted(
        m["00080018"]["Value"][0] for m in seg_meta
    )
    instance = instances[0]
    assert value(instance, "SOPClassUID") == SEG
    retrieved = dw.retrieve_instance(study, seg_series, value(instance, "SOPInstanceUID"))
    assert retrieved.SOPInstanceUID == value(instance, "SOPInstanceUID")
    # (dicomweb-client sends a Host header without the port: the RetrieveURL follows it)
    assert value(instance, "RetrieveURL").endswith(
        f"/dicomweb/studies/{study}/series/{seg_series}/instances/{retrieved.SOPInstanceUID}"
    )

    # root-level searches carry the study attributes; study-level instance searches too
    roots = dw.search_for_series(search_filters={"PatientID": "QIDO-B"})
    assert {value(s, "StudyInstanceUID") for s in roots} == {held[1]}
    assert all(value(s, "PatientID") == "QIDO-B" for s in roots)
    srs = dw.search_for_instances(search_filters={"SOPClassUID": SR_3D, "StudyInstanceUID": study})
    assert len(srs) == 1 and value(srs[0], "SeriesInstanceUID") == value(
        by_modality["SR"], "SeriesInstanceUID"
    )
    in_study = dw.search_for_instances(study)
    assert {value(i, "SOPClassUID") for i in in_study} == {SEG, SR_3D, SC}
    assert all(value(i, "Modality") for i in in_study)

    # the Secondary Capture key images are listed and served like the SEG and SR
    key_images = dw.search_for_instances(study, search_filters={"SOPClassUID": SC})
    assert key_images
    for found in key_images:
        sc = dw.retrieve_instance(
            study, value(found, "SeriesInstanceUID"), value(found, "SOPInstanceUID")
        )
        assert sc.SOPClassUID == SC and sc.StudyInstanceUID == study
        assert sc.pixel_array.shape == (value(found, "Rows"), value(found, "Columns"), 3)


def test_qido_a_viewer_browses_the_study_list(server: dict[str, Any], held: list[str]) -> None:
    """The requests a web viewer (OHIF-like) sends, as raw HTTP."""
    c, reader = server["client"], {**auth(server["read"]), "Accept": "application/dicom+json"}
    r = c.get(
        "/dicomweb/studies?limit=101&offset=0&fuzzymatching=true"
        "&includefield=00081030%2C00080060&StudyDate=20240101-20251231&PatientName=*A*",
        headers=reader,
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/dicom+json"
    assert "fuzzymatching" in r.headers["warning"] and r.headers["warning"].startswith("299 ")
    assert {value(s, "StudyInstanceUID") for s in ours(r.json(), held)} == set(held)
    r = c.get(f"/dicomweb/studies/{held[1]}/series?includefield=0008103E", headers=reader)
    assert r.status_code == 200 and "warning" not in r.headers
    for series in r.json():
        assert "0020000E" in series and "00080060" in series
        # the RetrieveURL answers WADO-RS as it is
        wado = c.get(value(series, "RetrieveURL"), headers=auth(server["read"]))
        assert wado.status_code == 200, value(series, "RetrieveURL")
        assert wado.headers["content-type"].startswith("multipart/related")
        meta = c.get(
            f"/dicomweb/studies/{held[1]}/series/{value(series, 'SeriesInstanceUID')}/metadata",
            headers=reader,
        )
        assert meta.status_code == 200 and meta.json()
    # nothing matches: an empty array
    r = c.get("/dicomweb/studies?PatientID=NOBODY", headers=reader)
    assert r.status_code == 200 and r.json() == []
    assert c.get("/dicomweb/studies/1.2.3.999/series", headers=reader).json() == []


@pytest.mark.parametrize(
    "query",
    [
        "limit=-1", "limit=ten", "offset=x", "fuzzymatching=maybe", "NotAKeyword=1",
        "ReferencedSeriesSequence=1", "00081115.0020000E=1", "StudyDate=yesterday",
        "StudyDate=-", "PatientID=a&PatientID=b", "NumberOfFrames=many", "includefield=Nope",
        "ffffffff=1",
    ],
)  # fmt: skip
def test_qido_queries_it_cannot_run_are_400(
    server: dict[str, Any], held: list[str], query: str
) -> None:
    r = server["client"].get(f"/dicomweb/studies?{query}", headers=auth(server["read"]))
    assert r.status_code == 400, (query, r.text)
    assert r.json()["error"]["code"] == "invalid_request"


def test_qido_needs_a_read_key_and_dicom_json(server: dict[str, Any], held: list[str]) -> None:
    c = server["client"]
    for path in ("/dicomweb/studies", f"/dicomweb/studies/{held[0]}/series", "/dicomweb/instances"):
        assert c.get(path).status_code == 401
        assert c.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
        r = c.get(path, headers={**auth(server["read"]), "Accept": "application/dicom+xml"})
        assert r.status_code == 406


def test_qido_past_the_server_maximum_says_more_results_exist(
    server: dict[str, Any], held: list[str]
) -> None:
    search = QidoSearch(server["service"].results, max_results=1)
    everything = search.search(parse_query([], "study"), "http://h/dicomweb")
    assert len(everything.results) == 1 and everything.warnings == [MORE_WARNING]
    asked = search.search(parse_query([("limit", "5")], "study"), "http://h/dicomweb")
    assert len(asked.results) == 1 and asked.warnings == [MORE_WARNING]
    last = len(server["dw"].search_for_studies()) - 1
    page = search.search(parse_query([("offset", str(last))], "study"), "http://h/dicomweb")
    assert len(page.results) == 1 and page.warnings == []  # nothing beyond it
    one = search.search(parse_query([("limit", "1")], "study"), "http://h/dicomweb")
    assert one.warnings == []  # the client asked for one: no warning
