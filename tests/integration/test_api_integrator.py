"""What an integrator meets when probing a running server by hand: byte ranges on the
file routes (an odd Range header must not turn a download into a 400), no server
folders in error messages, the console's audit trail as data, and every public route
in the OpenAPI document."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job

FILES = (
    "/v1/jobs/{job}/labels",
    "/v1/jobs/{job}/images/1",
    "/v1/jobs/{job}/volume",
    "/console/api/jobs/{job}/files/report.json",
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("integrator")
    roles = ("submit", "read", "admin")
    with live_server(settings_for(root), roles=roles, console=True) as live:
        c = live["client"]
        files = upload(make_study(root / "s"))
        r = c.post("/v1/studies", files=files, headers=auth(live["submit"]))
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"], live["submit"])
        assert job["state"] == "succeeded", job
        yield {**live, "job": job["id"]}


@pytest.mark.parametrize("path", FILES)
def test_file_routes_serve_ranges_and_ignore_a_range_header_they_cannot_parse(
    live: dict[str, Any], path: str
) -> None:
    c, reader = live["client"], auth(live["read"])
    url = path.format(job=live["job"])
    whole = c.get(url, headers=reader)
    assert whole.status_code == 200 and len(whole.content) > 10
    # RFC 9110 14.2: an unknown unit MUST be ignored, an invalid range MAY be
    for odd in ("items=0-1", "bytes=abc", "bytes=5-1", "bytes="):
        r = c.get(url, headers={**reader, "Range": odd})
        assert r.status_code == 200, (odd, r.status_code, r.text[:200])
        assert r.content == whole.content
    part = c.get(url, headers={**reader, "Range": "bytes=0-9"})
    assert part.status_code == 206 and part.content == whole.content[:10]
    past = c.get(url, headers={**reader, "Range": f"bytes={len(whole.content) + 10}-"})
    assert past.status_code == 416 and past.json()["error"]["code"] == "range_not_satisfiable"
    assert past.headers["content-range"] == f"bytes */{len(whole.content)}"


READS = (
    "/v1/jobs/{job}",
    "/v1/jobs/{job}/report",
    "/v1/jobs/{job}/fhir",
    "/v1/jobs/{job}/labels",
    "/v1/jobs/{job}/images/1",
    "/v1/jobs",
    "/v1/models",
    "/v1/ops/turnaround",
    "/healthz",
    "/metrics",
)


@pytest.mark.parametrize("path", READS)
def test_a_read_refuses_an_accept_it_cannot_serve_with_406_naming_what_it_serves(
    live: dict[str, Any], path: str
) -> None:
    """One negotiation rule for every route with one representation (api.negotiation):
    an Accept header that allows none of it gets 406 naming the type the route serves,
    and a header that allows it, among others, is served."""
    c, admin = live["client"], auth(live["admin"])
    url = path.format(job=live["job"])
    served = c.get(url, headers=admin)
    assert served.status_code == 200, served.text[:300]
    media = served.headers["content-type"].split(";")[0]
    refused = c.get(url, headers={**admin, "Accept": "application/x-nothing"})
    assert refused.status_code == 406 and refused.json()["error"]["code"] == "not_acceptable"
    assert media in refused.json()["error"]["message"]
    among = c.get(url, headers={**admin, "Accept": f"application/x-nothing, {media};q=0.2"})
    assert among.status_code == 200


def test_the_fhir_bundle_is_json_only_and_says_so(live: dict[str, Any]) -> None:
    """``Accept: application/fhir+xml`` was answered with JSON; radserve writes the
    Bundle as JSON only, so XML gets 406; ``application/json`` (the FHIR JSON's
    structured-syntax parent) is served."""
    c, reader = live["client"], auth(live["read"])
    url = f"/v1/jobs/{live['job']}/fhir"
    xml = c.get(url, headers={**reader, "Accept": "application/fhir+xml"})
    assert xml.status_code == 406 and "application/fhir+json" in xml.json()["error"]["message"]
    as_json = c.get(url, headers={**reader, "Accept": "application/json"})
    assert as_json.status_code == 200
    assert as_json.headers["content-type"].startswith("application/fhir+json")


def _zip(files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return out.getvalue()


def test_a_refused_bundle_upload_names_no_server_folder(live: dict[str, Any]) -> None:
    c, admin = live["client"], auth(live["admin"])
    data_dir = str(live["service"].settings.data_dir)
    answers = {
        "not a zip": c.post("/v1/models", content=b"not a zip", headers=admin),
        "bad YAML": c.post(
            "/v1/models", content=_zip({"b/model.yaml": "version: [1\n"}), headers=admin
        ),
        "incomplete manifest": c.post(
            "/v1/models", content=_zip({"b/model.yaml": "name: x\nversion: '1'\n"}), headers=admin
        ),
    }
    for why, r in answers.items():
        assert r.status_code == 422 and r.json()["error"]["code"] == "bundle_rejected", why
        message = r.json()["error"]["message"]
        assert data_dir not in message and ".staging" not in message, (why, message)
        assert ".uploads" not in message, (why, message)
    assert "is not a zip archive" in answers["not a zip"].json()["error"]["message"]
    for why in ("bad YAML", "incomplete manifest"):
        assert "model manifest model.yaml" in answers[why].json()["error"]["message"]


def test_the_console_trail_holds_each_record_as_an_object(live: dict[str, Any]) -> None:
    detail = live["client"].get(f"/console/api/jobs/{live['job']}", headers=auth(live["admin"]))
    assert detail.status_code == 200, detail.text
    trail = detail.json()["trail"]
    submitted = next(t for t in trail if t["action"] == "job.submitted")
    assert submitted["payload"]["pipeline"] == "test-pipeline"  # an object, not JSON text


def test_the_ct_volume_route_is_in_the_openapi_document(live: dict[str, Any]) -> None:
    doc = live["client"].get("/openapi.json", headers=auth(live["read"])).json()
    volume = doc["paths"]["/v1/jobs/{job_id}/volume"]["get"]
    assert "application/gzip" in volume["responses"]["200"]["content"]
    assert {"206", "416", "404"} <= set(volume["responses"])
    assert not [p for p in doc["paths"] if p.startswith("/console/")]  # the console's own


def test_paths_on_this_host_are_shortened_urls_and_media_types_kept(tmp_path: Path) -> None:
    from radserve.api.server_paths import without_server_paths

    inside = tmp_path / "models" / ".staging" / "tmp1" / "model.yaml"
    shortened = {
        f"cannot read model manifest {inside}: bad": "cannot read model manifest model.yaml: bad",
        f"({tmp_path}/x.zip) is not": "(x.zip) is not",
    }
    kept = [
        "see /v1/jobs/abc/report",
        "POST https://ehr.example.org/fhir/Bundle",
        'multipart/related; type="application/dicom"',
        "a relative/path/name",
    ]
    assert {m: without_server_paths(m) for m in shortened} == shortened
    assert [without_server_paths(m) for m in kept] == kept


@pytest.mark.parametrize("path", ("/healthz", "/v1/jobs/{job}", "/v1/jobs/{job}/report", *FILES))
def test_head_answers_like_get_without_a_body(live: dict[str, Any], path: str) -> None:
    c, reader = live["client"], auth(live["read"])
    url = path.format(job=live["job"])
    get, head = c.get(url, headers=reader), c.head(url, headers=reader)
    assert (head.status_code, get.status_code) == (200, 200)
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    if path in FILES or path.endswith("/report"):  # the same bytes each time
        assert int(head.headers["content-length"]) == len(get.content)
    else:  # /healthz's uptime and a job's figures change between the two requests
        assert int(head.headers["content-length"]) > 0
    unknown = c.head("/v1/jobs/no-such-job", headers=reader)
    assert unknown.status_code == 404 and unknown.content == b""


@pytest.mark.parametrize(
    "query",
    [
        "StudyDate=2020-abc",
        "StudyDate=-",
        "StudyTime=25h",
        "NumberOfStudyRelatedInstances=many",
    ],
)
def test_a_qido_value_that_cannot_be_compared_is_400_even_with_nothing_to_match(
    live: dict[str, Any], query: str
) -> None:
    """This server's DICOMweb index is empty (its job came over REST): the value used to
    be checked only against a row, so junk answered 200 [] here and 400 elsewhere."""
    r = live["client"].get(f"/dicomweb/studies?{query}", headers=auth(live["read"]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    ok = live["client"].get("/dicomweb/studies?StudyDate=20200101-", headers=auth(live["read"]))
    assert ok.status_code == 200 and ok.json() == []
