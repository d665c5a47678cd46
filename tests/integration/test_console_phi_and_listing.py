"""What a console session may download, and how job lists are filtered, against the
real app (console installed) over HTTP, ``security.visibility: site``, real jobs.

- A session whose role is not in ``console.phi_roles`` gets no download that names the
  patient (FHIR Bundle, DICOM SEG/SR, DICOMweb): 403 naming ``console.phi_roles``, and
  the study view offers none; an API key keeps its documented access.
- The worklist and ``GET /v1/jobs`` filter by visibility (and class) in their query:
  full pages, and a ``next_cursor`` that names only a job the caller may see.
- Bad dates, file names and cursors are 4xx JSON errors, never 500.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pydicom
import pytest
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.factories.service import ServerThread, auth, make_study, settings_for, upload, wait_job
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.service import Service

pytestmark = pytest.mark.slow


def _stow(c: httpx.Client, files: list[Path], token: str) -> httpx.Response:
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for path in files:
        body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        body += path.read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    kind = f'multipart/related; type="application/dicom"; boundary={boundary}'
    return c.post("/dicomweb/studies", content=body, headers={"Content-Type": kind, **auth(token)})


def _submit(c: httpx.Client, root: Path, token: str, priority: str) -> str:
    r = c.post(
        f"/v1/studies?priority={priority}", files=upload(make_study(root)), headers=auth(token)
    )
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    assert wait_job(c, job_id, token)["state"] == "succeeded"
    return job_id


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=requires_postgres)]
)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        database = {}
        if request.param == "postgres":  # the visibility rule's subquery on both stores
            database["database_url"] = stack.enter_context(postgres_schema("radserve_listing"))
        yield from _server(tmp_path_factory.mktemp("console-phi"), database)


def _server(root: Path, database: dict[str, str]) -> Iterator[dict[str, Any]]:
    service = Service(settings_for(root, security__visibility="site", **database))
    app = create_app(service)
    install_console(app, service)

    def key(role: str, site: str | None = None) -> str:
        _, token = service.store.create_api_key(name=f"{role} {site}", role=role, site=site)
        return token

    keys = {
        "submit_n": key("submit", "N"),
        "submit_s": key("submit", "S"),
        "read_n": key("read", "N"),
        "read_s": key("read", "S"),
        "admin": key("admin"),
    }
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        files = make_study(root / "web")
        stored = _stow(c, files, keys["submit_n"])
        assert stored.status_code in (200, 202), stored.text
        link = stored.headers["link"]
        web_job = link[len("</v1/jobs/") : -len('>; rel="related"')]
        assert wait_job(c, web_job, keys["submit_n"])["state"] == "succeeded"
        # oldest first: site S's URGENT job, then two of site N's, then S's newest
        jobs = {
            "web": web_job,
            "s_old": _submit(c, root / "s1", keys["submit_s"], "urgent"),
            "n1": _submit(c, root / "n1", keys["submit_n"], "outpatient"),
            "n2": _submit(c, root / "n2", keys["submit_n"], "outpatient"),
            "s_new": _submit(c, root / "s2", keys["submit_s"], "outpatient"),
        }
        study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
        yield {"url": srv.url, "keys": keys, "jobs": jobs, "study": study, "client": c}


@contextmanager
def _session(server: dict[str, Any], key: str) -> Iterator[httpx.Client]:
    """A browser signed in with ``key`` (a session cookie, no key on its requests)."""
    with httpx.Client(base_url=server["url"], timeout=60) as c:
        r = c.post("/console/api/session", json={"key": server["keys"][key]})
        assert r.status_code == 200, r.text
        yield c


def _refused_phi(r: httpx.Response) -> None:
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "forbidden"
    assert "console.phi_roles" in error["message"]


def test_a_session_outside_phi_roles_gets_no_patient_identifiers(server: dict[str, Any]) -> None:
    job, study = server["jobs"]["web"], server["study"]
    with _session(server, "read_n") as c:
        _refused_phi(c.get(f"/v1/jobs/{job}/fhir"))
        detail = c.get(f"/console/api/jobs/{job}").json()
        assert (detail["phi_allowed"], detail["phi_downloads"]) == (False, False)
        assert detail["files"] and not [f for f in detail["files"] if f.endswith(".dcm")]
        for name in ("organs-seg.dcm", "measurements-sr.dcm"):
            _refused_phi(c.get(f"/console/api/jobs/{job}/files/{name}"))
        dicom_json = {"Accept": "application/dicom+json"}
        _refused_phi(c.get("/dicomweb/studies", headers=dicom_json))
        _refused_phi(c.get(f"/dicomweb/studies/{study}/metadata", headers=dicom_json))
        _refused_phi(c.get(f"/dicomweb/studies/{study}"))
        # what names no patient is still there
        assert c.get(f"/v1/jobs/{job}/report").status_code == 200
        assert c.get(f"/console/api/jobs/{job}/files/report.json").status_code == 200

    # a read key keeps its documented access (RIS integrations read FHIR)
    c = server["client"]
    fhir = c.get(f"/v1/jobs/{job}/fhir", headers=auth(server["keys"]["read_n"]))
    assert fhir.status_code == 200, fhir.text
    assert any(e["resource"]["resourceType"] == "Patient" for e in fhir.json()["entry"])

    # an admin session (console.phi_roles' default) is offered and gets them
    with _session(server, "admin") as c:
        detail = c.get(f"/console/api/jobs/{job}").json()
        assert detail["phi_downloads"] is True
        dicom = [f for f in detail["files"] if f.endswith(".dcm")]
        assert "organs-seg.dcm" in dicom
        assert c.get(f"/v1/jobs/{job}/fhir").status_code == 200
        seg = c.get(f"/console/api/jobs/{job}/files/organs-seg.dcm")
        assert seg.status_code == 200 and seg.content[128:132] == b"DICM"


def _ids(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["items"]]


def test_the_worklist_filters_in_its_query(server: dict[str, Any]) -> None:
    jobs, keys, c = server["jobs"], server["keys"], server["client"]
    # site S's two jobs, though site N's two newer ones came between them
    south = auth(keys["read_s"])
    assert _ids(c.get("/console/api/worklist?limit=2", headers=south)) == [
        jobs["s_new"],
        jobs["s_old"],
    ]
    with _session(server, "read_s") as session:
        assert _ids(session.get("/console/api/worklist?limit=2")) == [jobs["s_new"], jobs["s_old"]]
    # the one URGENT job, though newer routine ones came after it
    admin = auth(keys["admin"])
    urgent = c.get("/console/api/worklist?priority_class=URGENT&limit=1", headers=admin)
    assert _ids(urgent) == [jobs["s_old"]]
    bogus = c.get("/console/api/worklist?priority_class=bogus", headers=admin)
    assert bogus.status_code == 400 and bogus.json()["error"]["code"] == "invalid_request"


def _cursor_job(cursor: str) -> str:
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    return raw.split("|", 1)[1]


def test_job_pages_are_full_and_their_cursor_names_only_visible_jobs(
    server: dict[str, Any],
) -> None:
    jobs, keys, c = server["jobs"], server["keys"], server["client"]
    for who, mine in (
        ("read_s", [jobs["s_new"], jobs["s_old"]]),
        ("read_n", [jobs["n2"], jobs["n1"], jobs["web"]]),
    ):
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            query = "/v1/jobs?limit=1" + (f"&cursor={cursor}" if cursor else "")
            page = c.get(query, headers=auth(keys[who])).json()
            assert len(page["items"]) == 1, (who, page)  # full, never an empty page
            seen += [j["id"] for j in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert _cursor_job(cursor) in mine, who  # never a job of the other site
        assert seen == mine, who


def test_bad_dates_names_and_cursors_are_4xx_json(server: dict[str, Any]) -> None:
    jobs, c = server["jobs"], server["client"]
    admin = auth(server["keys"]["admin"])
    for query in (
        "created_before=9999-12-31T23:59:59-23:59",
        "created_after=0001-01-01T00:00:00%2B23:59",
        "created_before=0001-01-01T00:00:00%2B00:01",
    ):
        r = c.get(f"/v1/jobs?{query}", headers=admin)
        assert r.status_code == 400, (query, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
    forged = base64.urlsafe_b64encode(b"9999-12-31T23:59:59-23:59|x").decode().rstrip("=")
    r = c.get(f"/v1/jobs?cursor={forged}", headers=admin)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_cursor", r.text
    # a valid last day means no upper bound; the first day no lower one
    everything = set(jobs.values())
    bounds = (
        "date_to=9999-12-31",
        "date_from=0001-01-01",
        "date_from=0001-01-01&date_to=9999-12-31",
    )
    for query in bounds:
        assert set(_ids(c.get(f"/console/api/worklist?{query}", headers=admin))) == everything
    assert _ids(c.get("/console/api/worklist?date_from=9999-12-31", headers=admin)) == []
    long = "a" * 300
    for name in (f"{long}.json", f"{long}.dcm", f"{long}.nii.gz", "b" * 250 + ".json"):
        for method in ("GET", "HEAD"):
            r = c.request(method, f"/console/api/jobs/{jobs['n1']}/files/{name}", headers=admin)
            assert r.status_code == 404, (method, name, r.status_code)
            if method == "GET":
                assert r.json()["error"]["code"] == "output_not_found"


def test_patient_data_and_results_are_never_stored_by_a_cache(server: dict[str, Any]) -> None:
    job, study, c = server["jobs"]["web"], server["study"], server["client"]
    admin = auth(server["keys"]["admin"])
    dicom_json = {**admin, "Accept": "application/dicom+json"}
    reads = [
        (f"/v1/jobs/{job}/report", admin),
        (f"/v1/jobs/{job}/fhir", admin),
        (f"/v1/jobs/{job}/labels", admin),
        (f"/v1/jobs/{job}/images/1", admin),
        (f"/v1/jobs/{job}/volume", admin),
        (f"/v1/jobs/{job}", admin),
        ("/v1/jobs", admin),
        (f"/console/api/jobs/{job}", admin),
        (f"/console/api/jobs/{job}/files/report.json", admin),
        (f"/console/api/jobs/{job}/files/organs-seg.dcm", admin),
        ("/console/api/worklist", admin),
        (f"/dicomweb/studies/{study}/metadata", dicom_json),
        (f"/dicomweb/studies/{study}", admin),
        ("/dicomweb/studies", dicom_json),
    ]
    for path, headers in reads:
        for method in ("GET", "HEAD"):
            r = c.request(method, path, headers=headers)
            assert r.status_code == 200, (method, path, r.text[:200])
            assert r.headers.get("cache-control") == "no-store", (method, path, r.headers)
