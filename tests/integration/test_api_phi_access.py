"""Reads of patient data are audited (who, which job, what, when) and, with
``security.visibility``, a read key sees only its submitter's (or site's) jobs: real API
keys against the running app, over REST and DICOMweb."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pydicom
import pytest
from tests.factories.service import (
    ServerThread,
    auth,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.service import Service


def _key(service: Service, role: str, **scope: str) -> str:
    _, token = service.store.create_api_key(name=f"{role} {scope}", role=role, **scope)
    return token


def _key_id(token: str) -> str:
    return token.split("_")[1]


def _stow(client: httpx.Client, files: list[Any], token: str) -> httpx.Response:
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for path in files:
        body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        body += path.read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    headers = {
        "Content-Type": f'multipart/related; type="application/dicom"; boundary={boundary}',
        **auth(token),
    }
    return client.post("/dicomweb/studies", content=body, headers=headers)


@pytest.fixture(scope="module", params=["own_submitter", "site"])
def server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[dict[str, Any]]:
    rule = request.param
    root = tmp_path_factory.mktemp(f"phi-{rule}")
    service = Service(settings_for(root, security__visibility=rule))
    scope = "submitter" if rule == "own_submitter" else "site"
    keys = {
        "submit_a": _key(service, "submit", **{scope: "A"}),
        "submit_b": _key(service, "submit", **{scope: "B"}),
        "read_a": _key(service, "read", **{scope: "A"}),
        "read_b": _key(service, "read", **{scope: "B"}),
        "read_none": _key(service, "read"),
        "admin": _key(service, "admin"),
    }
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        job = c.post(
            "/v1/studies", files=upload(make_study(root / "rest")), headers=auth(keys["submit_a"])
        ).json()
        assert wait_job(c, job["id"], keys["submit_a"])["state"] == "succeeded"
        files = make_study(root / "dicomweb")
        stored = _stow(c, files, keys["submit_a"])
        assert stored.status_code in (200, 202), stored.text
        study_uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
        link = stored.headers["link"]
        web_job = link[len("</v1/jobs/") : -len('>; rel="related"')]
        assert wait_job(c, web_job, keys["submit_a"])["state"] == "succeeded"
        yield {"client": c, "service": service, "keys": keys, "job": job["id"],
               "web_job": web_job, "study": study_uid}  # fmt: skip


READS = ("report", "fhir", "labels", "images/1")


def _phi_reads(service: Service, since: int) -> list[Any]:
    return [r for r in service.store.iter_audit(after=since) if r.action == "phi.read"]


def test_visible_reads_are_audited_with_who_what_and_when(server: dict[str, Any]) -> None:
    c, service, keys = server["client"], server["service"], server["keys"]
    since = service.store.audit_head()[0]
    before = dt.datetime.now(dt.UTC)
    for path in READS:
        r = c.get(f"/v1/jobs/{server['job']}/{path}", headers=auth(keys["read_a"]))
        assert r.status_code == 200, (path, r.text)
    meta = c.get(
        f"/dicomweb/studies/{server['study']}/metadata",
        headers={**auth(keys["read_a"]), "Accept": "application/dicom+json"},
    )
    assert meta.status_code == 200, meta.text
    reads = _phi_reads(service, since)
    assert [r.payload["resource"] for r in reads] == [
        "report", "fhir_bundle", "labels", "key_image", "wado_metadata",
    ]  # fmt: skip
    for record in reads:
        assert record.actor_key_id == _key_id(keys["read_a"])
        assert record.client_address == "127.0.0.1"
        assert record.payload["key_name"].startswith("read")
        assert record.ts >= before - dt.timedelta(seconds=1)
    assert {r.subject for r in reads[:4]} == {server["job"]}
    assert reads[4].subject == server["web_job"]
    assert reads[4].payload["study"] == server["study"]
    assert service.store.verify_audit().ok


def test_other_submitters_and_sites_see_nothing(server: dict[str, Any]) -> None:
    c, service, keys = server["client"], server["service"], server["keys"]
    since = service.store.audit_head()[0]
    for who in ("read_b", "read_none"):
        headers = auth(keys[who])
        assert c.get(f"/v1/jobs/{server['job']}", headers=headers).status_code == 404
        for path in READS:
            r = c.get(f"/v1/jobs/{server['job']}/{path}", headers=headers)
            assert r.status_code == 404, (who, path)
            assert r.json()["error"]["code"] == "job_not_found"
        listed = c.get("/v1/jobs", headers=headers).json()["items"]
        assert server["job"] not in {j["id"] for j in listed}
        for suffix in ("/metadata", ""):
            r = c.get(f"/dicomweb/studies/{server['study']}{suffix}", headers=headers)
            assert r.status_code == 404, (who, suffix)
    assert _phi_reads(service, since) == []  # nothing was read
    # changing a job one may not see says as little: 404, not a 403 that it exists
    other = auth(keys["submit_b"])
    for answer in (
        c.delete(f"/v1/jobs/{server['job']}", headers=other),
        c.post(
            f"/v1/jobs/{server['job']}/priority", json={"priority_class": "urgent"}, headers=other
        ),
    ):
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "job_not_found"


def test_admin_and_the_same_scope_see_everything(server: dict[str, Any]) -> None:
    c, keys = server["client"], server["keys"]
    for who in ("admin", "read_a", "submit_a"):
        listed = c.get("/v1/jobs", headers=auth(keys[who])).json()["items"]
        assert {server["job"], server["web_job"]} <= {j["id"] for j in listed}, who
        assert c.get(f"/v1/jobs/{server['job']}/report", headers=auth(keys[who])).status_code == 200


def test_default_visibility_is_all_and_reads_are_still_audited(tmp_path) -> None:
    service = Service(settings_for(tmp_path))
    submit, other = _key(service, "submit", submitter="A"), _key(service, "read", submitter="B")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        job = c.post("/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(submit))
        job_id = job.json()["id"]
        assert wait_job(c, job_id, submit)["state"] == "succeeded"
        assert c.get(f"/v1/jobs/{job_id}/report", headers=auth(other)).status_code == 200
        reads = _phi_reads(service, 0)
        assert [(r.subject, r.actor_key_id) for r in reads] == [(job_id, _key_id(other))]


def test_qido_lists_only_visible_studies_and_audits_what_it_answers(
    server: dict[str, Any],
) -> None:
    """QIDO-RS answers patient names and IDs: the same visibility rule and audit as WADO."""
    c, service, keys = server["client"], server["service"], server["keys"]
    dicom_json = {"Accept": "application/dicom+json"}
    since = service.store.audit_head()[0]
    for who in ("read_b", "read_none"):
        for path in ("/dicomweb/studies", "/dicomweb/series", "/dicomweb/instances",
                     f"/dicomweb/studies/{server['study']}/series"):  # fmt: skip
            r = c.get(path, headers={**auth(keys[who]), **dicom_json})
            assert r.status_code == 200 and r.json() == [], (who, path)
    assert _phi_reads(service, since) == []  # nothing shown, nothing audited
    for who in ("read_a", "admin"):
        since = service.store.audit_head()[0]
        r = c.get("/dicomweb/studies", headers={**auth(keys[who]), **dicom_json})
        assert [s["0020000D"]["Value"][0] for s in r.json()] == [server["study"]], who
        reads = _phi_reads(service, since)
        assert [(x.subject, x.payload["resource"]) for x in reads] == [
            (server["web_job"], "qido_search")
        ]
        assert reads[0].actor_key_id == _key_id(keys[who])
