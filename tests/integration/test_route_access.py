"""Who may call what, for every route ``radserve serve`` answers (the API and the
console), against the real app over HTTP under ``security.visibility: site``.

:data:`ROUTES` classifies each route: the least role it needs, whether it names a job
or a study (another site's answers 404, as for one that does not exist), and whether a
console session needs a role in ``console.phi_roles``. A route nobody classified fails
:func:`test_every_route_is_classified`: add it to :data:`ROUTES` (and to
docs/security.md) before it can ship unguarded.

Every route is then called by nobody, a forged key, a key and a console session of each
role of site N (whose job and study the fixture made), and another site's keys and
sessions (site S, one a local user's): a caller below the route's role gets 401/403, a
caller of site N gets past the checks, and no answer to site S holds site N's job id,
accession or study UID. Every state-changing route refuses a session's request from
another origin or without its CSRF token; every path parameter refuses traversal, NUL,
very long and look-alike values with a 4xx and never reads a file outside the data
folder. Signing in ends the session the browser held; signing out ends it on the server.
"""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pydicom
import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import Mount
from tests.factories.dicomweb import related
from tests.factories.service import ServerThread, auth, make_study, settings_for, upload, wait_job
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.passwords import hash_password
from radserve.security.keys import role_allows
from radserve.service import Service

ROLES = ("read", "submit", "admin")


@dataclass(frozen=True)
class Rule:
    """``need``: ``public``, ``read``, ``submit``, ``admin``, or ``session`` (the console's
    sign-in endpoints: tested on their own below). ``scope``: ``job`` or ``study`` when the
    path names one (another site's is 404), else None (a list or a figure: it must name
    nothing of another site's). ``phi``: ``session`` when a console session needs a role in
    ``console.phi_roles`` (it names the patient), ``all`` when every caller does."""

    need: str
    scope: str | None = None
    phi: str | None = None
    body: dict[str, Any] | None = None  # a valid JSON body, for the injection test


PUBLIC = Rule("public")
DEPLOY = {"version": "1.0.0", "reason": "route access test"}
CHANGE = {"reason": "route access test"}

ROUTES: dict[tuple[str, str], Rule] = {
    # no key: liveness, metrics (server.metrics_require_key), the console page and its
    # assets, and how to sign in
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/metrics"): PUBLIC,
    ("GET", "/"): PUBLIC,
    ("MOUNT", "/console/assets"): PUBLIC,
    ("MOUNT", "/docs/static"): PUBLIC,  # Swagger UI's files; the schema is behind a key
    ("GET", "/console/api/signin"): PUBLIC,
    ("POST", "/console/api/session"): Rule("session"),
    ("GET", "/console/api/session"): Rule("session"),
    ("DELETE", "/console/api/session"): Rule("session"),
    # read
    ("GET", "/readyz"): Rule("read"),
    ("GET", "/openapi.json"): Rule("read"),
    ("GET", "/docs"): Rule("read"),
    ("GET", "/v1/jobs"): Rule("read"),
    ("GET", "/v1/jobs/{job_id}"): Rule("read", "job"),
    ("GET", "/v1/jobs/{job_id}/report"): Rule("read", "job"),
    ("GET", "/v1/jobs/{job_id}/labels"): Rule("read", "job"),
    ("GET", "/v1/jobs/{job_id}/images/{number}"): Rule("read", "job"),
    ("GET", "/v1/jobs/{job_id}/fhir"): Rule("read", "job", phi="session"),
    ("GET", "/v1/jobs/{job_id}/deliveries"): Rule("read", "job"),
    ("GET", "/v1/jobs/{job_id}/volume"): Rule("read", "job"),
    ("GET", "/dicomweb/studies/{study}"): Rule("read", "study", phi="session"),
    ("GET", "/dicomweb/studies/{study}/metadata"): Rule("read", "study", phi="session"),
    ("GET", "/dicomweb/studies/{study}/series/{series}"): Rule("read", "study", phi="session"),
    ("GET", "/dicomweb/studies/{study}/series/{series}/metadata"): Rule(
        "read", "study", phi="session"
    ),
    ("GET", "/dicomweb/studies/{study}/series/{series}/instances/{instance}"): Rule(
        "read", "study", phi="session"
    ),
    ("GET", "/dicomweb/studies/{study}/series/{series}/instances/{instance}/metadata"): Rule(
        "read", "study", phi="session"
    ),
    # QIDO-RS: searches, filtered by the rule (another site's study is an empty answer)
    ("GET", "/dicomweb/studies"): Rule("read", phi="session"),
    ("GET", "/dicomweb/series"): Rule("read", phi="session"),
    ("GET", "/dicomweb/instances"): Rule("read", phi="session"),
    ("GET", "/dicomweb/studies/{study}/series"): Rule("read", phi="session"),
    ("GET", "/dicomweb/studies/{study}/instances"): Rule("read", phi="session"),
    ("GET", "/dicomweb/studies/{study}/series/{series}/instances"): Rule("read", phi="session"),
    ("GET", "/v1/models"): Rule("read"),
    ("GET", "/v1/models/installs"): Rule("read"),
    ("GET", "/v1/models/installs/{install_id}"): Rule("read"),
    ("GET", "/v1/models/deployments"): Rule("read"),
    ("GET", "/v1/models/comparisons"): Rule("read"),
    ("GET", "/v1/models/drift"): Rule("read"),
    ("GET", "/v1/ops/service-times"): Rule("read"),
    ("GET", "/v1/ops/turnaround"): Rule("read"),
    ("GET", "/console/api/worklist"): Rule("read"),
    ("GET", "/console/api/events"): Rule("read"),
    ("GET", "/console/api/ops"): Rule("read"),
    ("GET", "/console/api/jobs/{job_id}"): Rule("read", "job"),
    ("GET", "/console/api/jobs/{job_id}/patient"): Rule("read", "job", phi="all"),
    ("GET", "/console/api/jobs/{job_id}/files/{name}"): Rule("read", "job"),
    # submit (cancel and re-prioritise: a submit key its own jobs)
    ("POST", "/v1/studies"): Rule("submit"),
    ("POST", "/v1/studies/batch"): Rule("submit"),
    ("POST", "/dicomweb/studies"): Rule("submit"),
    ("POST", "/dicomweb/studies/{study}"): Rule("submit"),
    ("DELETE", "/v1/jobs/{job_id}"): Rule("submit", "job"),
    ("POST", "/v1/jobs/{job_id}/priority"): Rule(
        "submit", "job", body={"priority_class": "urgent"}
    ),
    # admin
    ("POST", "/v1/admin/models/{name}/reset"): Rule("admin"),
    ("GET", "/v1/ops/outbox"): Rule("admin"),
    ("POST", "/v1/ops/outbox/{item_id}/retry"): Rule("admin"),
    ("GET", "/v1/ops/doctor"): Rule("admin"),
    ("POST", "/v1/models"): Rule("admin"),
    ("POST", "/v1/models/{step}/deploy"): Rule("admin", body=DEPLOY),
    ("POST", "/v1/models/{step}/promote"): Rule("admin", body=CHANGE),
    ("POST", "/v1/models/{step}/rollback"): Rule("admin", body=CHANGE),
    ("POST", "/v1/models/{step}/undeploy"): Rule("admin", body={"role": "shadow", **CHANGE}),
}


@dataclass(frozen=True)
class Caller:
    name: str
    role: str | None  # None: no valid credentials
    site: str | None
    session: bool = False


def _app_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path template) of every route the app answers; ``MOUNT`` for a mount."""
    found: set[tuple[str, str]] = set()
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute):
            found |= {(m, context.path) for m in route.methods - {"HEAD"}}
        elif isinstance(route, Mount):
            found.add(("MOUNT", route.path))
        else:
            found.add((type(route).__name__, getattr(route, "path", "?")))
    return found


def _user(name: str, role: str, site: str, password: str) -> dict[str, str]:
    return {"username": name, "role": role, "site": site, "password_hash": hash_password(password)}


@contextmanager
def _served(root: Path) -> Iterator[dict[str, Any]]:
    """The app ``radserve serve`` runs (API and console) under ``security.visibility:
    site`` on a loopback port, with a key of each role of site N, site S's read and
    submit keys, and site S's local read user."""
    (root / "outside.txt").write_text("OUTSIDE-THE-DATA-FOLDER")  # a traversal target
    users = [_user("nurse-s", "read", "S", "nurse-s-password")]
    service = Service(settings_for(root, security__visibility="site", console__users=users))
    app = create_app(service)
    install_console(app, service)
    tokens: dict[str, str] = {}
    for role in ROLES:
        _, tokens[f"{role}:N"] = service.store.create_api_key(
            name=f"{role} N", role=role, site=None if role == "admin" else "N"
        )
    for role in ("read", "submit"):
        _, tokens[f"{role}:S"] = service.store.create_api_key(name=f"{role} S", role=role, site="S")
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield {
            "app": app,
            "service": service,
            "client": c,
            "url": srv.url,
            "root": root,
            "data": Path(service.settings.data_dir),
            "tokens": tokens,
        }


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """:func:`_served` with no job (ids that name nothing): the route table and the
    session checks, which refuse before any job is looked up."""
    with _served(tmp_path_factory.mktemp("route-access-bare")) as served:
        ids = {"job": str(uuid.uuid4()), "study": "1.2.3", "series": "1.2.3.4"}
        yield {**served, **ids, "instance": "1.2.3.4.5"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """:func:`_served` with site N's job (stored over STOW-RS: a report and DICOM SEG/SR
    results) and, last, site S's own job."""
    root = tmp_path_factory.mktemp("route-access")
    with _served(root) as served:
        service, c, tokens = served["service"], served["client"], served["tokens"]
        assert service.wait_warm(60 * WAIT_SCALE)
        files = make_study(root / "n", extra={"AccessionNumber": "ACC-NORTH-7"})
        body, kind = related([(p.read_bytes(), "application/dicom") for p in files])
        stored = c.post(
            "/dicomweb/studies?complete=true",
            content=body,
            headers={"Content-Type": kind, **auth(tokens["submit:N"])},
        )
        assert stored.status_code in (200, 202), stored.text
        job = re.search(r"</v1/jobs/([^>]+)>", stored.headers["link"])
        assert job is not None
        job_id = job.group(1)
        assert wait_job(c, job_id, tokens["submit:N"])["state"] == "succeeded"
        study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
        found = c.get(
            f"/dicomweb/studies/{study}/instances",
            headers={**auth(tokens["admin:N"]), "Accept": "application/dicom+json"},
        ).json()
        assert found, "site N's job wrote no DICOM result"
        series, instance = found[0]["0020000E"]["Value"][0], found[0]["00080018"]["Value"][0]
        # site S's own job, submitted last: the event stream's replay ends with it
        s_job = c.post(
            "/v1/studies", files=upload(make_study(root / "s")), headers=auth(tokens["submit:S"])
        ).json()["id"]
        assert wait_job(c, s_job, tokens["submit:S"])["state"] == "succeeded"
        yield {
            **served,
            "job": job_id,
            "s_job": s_job,
            "study": study,
            "series": series,
            "instance": instance,
            # what names site N's patient study: never in an answer to site S
            "secrets": (job_id, "ACC-NORTH-7", study),
        }


# --- the table ----------------------------------------------------------------------------
def test_every_route_is_classified(bare: dict[str, Any]) -> None:
    routes = _app_routes(bare["app"])
    unclassified = sorted(routes - ROUTES.keys())
    assert not unclassified, (
        f"routes nobody classified: {unclassified}; add each to ROUTES in this test (the "
        "least role it needs, what it is scoped by) and to docs/security.md"
    )
    gone = sorted(ROUTES.keys() - routes)
    assert not gone, f"ROUTES lists routes the app no longer has: {gone}"


CALLERS = (
    Caller("nobody", None, None),
    Caller("forged key", None, None),
    *(Caller(f"{role} key N", role, "N") for role in ROLES),
    *(Caller(f"{role} session N", role, "N", session=True) for role in ROLES),
    Caller("read key S", "read", "S"),
    Caller("submit key S", "submit", "S"),
    Caller("submit session S", "submit", "S", session=True),
    Caller("read user S", "read", "S", session=True),
)


def _client(live: dict[str, Any], caller: Caller) -> httpx.Client:
    c = httpx.Client(base_url=live["url"], timeout=60)
    if caller.role is None:
        if caller.name == "forged key":
            c.headers["Authorization"] = "Bearer rsk_0000000000000000_" + "A" * 43
        return c
    token = live["tokens"][f"{caller.role}:{caller.site}"]
    if not caller.session:
        c.headers.update(auth(token))
        return c
    body: dict[str, str] = {"key": token}
    if caller.name == "read user S":
        body = {"username": "nurse-s", "password": "nurse-s-password"}
    r = c.post("/console/api/session", json=body)
    assert r.status_code == 200, r.text
    c.headers.update({"X-CSRF-Token": r.json()["csrf"], "Origin": live["url"]})
    return c


def _path(served: dict[str, Any], template: str, **values: str) -> str:
    fill = {
        "job_id": served["job"],
        "number": "1",
        "name": "report.json" if "/files/" in template else "organs-test",
        "study": served["study"],
        "series": served["series"],
        "instance": served["instance"],
        "install_id": "0" * 32,
        "item_id": "1",
        "step": "lesions-test",
        **values,
    }
    return re.sub(r"\{(\w+)\}", lambda m: fill[m.group(1)], template)


def _call(
    c: httpx.Client, method: str, path: str, rule: Rule, stop: tuple[str, ...]
) -> httpx.Response:
    if path == "/console/api/events":
        return _events(c, stop)
    kwargs: dict[str, Any] = {}
    if method != "GET":
        kwargs["json"] = rule.body if rule.body is not None else {}
    return c.request(method, path, **kwargs)


def _events(c: httpx.Client, stop: tuple[str, ...]) -> httpx.Response:
    """The event stream replayed from its start (``since=0``), read until an event for a
    job in ``stop`` (site S's job, the fixture's last: every event before it was sent
    first) or the stream's first ping."""
    text = ""
    with c.stream("GET", "/console/api/events", params={"since": 0}) as r:
        if r.status_code != 200:
            r.read()
            return r
        for line in r.iter_lines():
            text += line + "\n"
            if line.startswith(": ping") or (
                line.startswith("data:") and any(job in line for job in stop)
            ):
                break
    return httpx.Response(200, text=text, request=r.request)


def _expect(rule: Rule, caller: Caller) -> str:
    """``401``, ``403``, ``404`` or ``past`` (through every check: anything but those)."""
    if rule.need == "public":
        return "past"
    if caller.role is None:
        return "401"
    if not role_allows(caller.role, rule.need):
        return "403"
    if (rule.phi == "all" or (rule.phi == "session" and caller.session)) and caller.role != (
        "admin"
    ):
        return "403"  # console.phi_roles: admin (the default)
    if caller.site == "S" and rule.scope is not None:
        return "404"
    return "past"


@pytest.mark.slow
def test_each_route_answers_each_caller_as_classified(live: dict[str, Any]) -> None:
    wrong = []
    for caller in CALLERS:
        # site N's callers do not see site S's job: their replay ends at site N's
        stop = (live["s_job"],) if caller.site == "S" else (live["s_job"], live["job"])
        with closing(_client(live, caller)) as c:
            for (method, template), rule in ROUTES.items():
                if method == "MOUNT" or rule.need == "session":
                    continue
                path = _path(live, template)
                r = _call(c, method, path, rule, stop)
                want = _expect(rule, caller)
                # a 404 says "not yours" only where the path names a job or a study (an
                # install id or outbox row the fixture has none of is 404 to anyone)
                refused = (401, 403, 404) if rule.scope else (401, 403)
                got = str(r.status_code) if r.status_code in refused else "past"
                if got != want:
                    wrong.append(f"{caller.name}: {method} {path} -> {r.status_code}, want {want}")
                if caller.site == "S":
                    leaked = [s for s in live["secrets"] if s in r.text and s not in path]
                    if leaked:
                        wrong.append(f"{caller.name}: {method} {path} names site N's {leaked}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_site_n_sees_what_site_s_is_refused(live: dict[str, Any]) -> None:
    """The check above is only worth its 404s if site N is answered the data."""
    with closing(_client(live, Caller("read key N", "read", "N"))) as c:
        assert "ACC-NORTH-7" in c.get(f"/v1/jobs/{live['job']}/report").text
        assert live["job"] in c.get("/console/api/worklist").text
        assert live["job"] in _events(c, (live["job"],)).text


# --- sessions and CSRF --------------------------------------------------------------------
def _session(served: dict[str, Any], role: str = "admin") -> tuple[httpx.Client, str]:
    c = httpx.Client(base_url=served["url"], timeout=60)
    r = c.post("/console/api/session", json={"key": served["tokens"][f"{role}:N"]})
    assert r.status_code == 200, r.text
    return c, r.json()["csrf"]


def test_no_state_changing_route_takes_a_sessions_request_from_another_origin(
    bare: dict[str, Any],
) -> None:
    """Every route but GET, with an admin session's cookie: another origin (even with
    the token, which a cross-site page cannot read), a same-origin request without the
    token, and a request with neither (a form post of a browser that sends no Origin)."""
    c, csrf = _session(bare)
    evil = "http://evil.example"
    sibling = bare["url"].rsplit(":", 1)[0] + ":1"  # same site, another port
    with closing(c):
        for (method, template), rule in ROUTES.items():
            if method in ("GET", "MOUNT") or rule.need in ("public", "session"):
                continue
            path = _path(bare, template)
            for headers in (
                {"Origin": evil, "X-CSRF-Token": csrf},
                {"Origin": sibling, "X-CSRF-Token": csrf},
                {"Origin": "null", "X-CSRF-Token": csrf},
                {"Origin": bare["url"]},
                {"Origin": bare["url"], "X-CSRF-Token": "x" * len(csrf)},
                {},
            ):
                r = c.request(method, path, headers=headers, json=rule.body or {})
                assert r.status_code == 403, (method, path, headers, r.status_code, r.text)
                assert r.json()["error"]["code"] == "forbidden"
        # form posts: sign-in refuses another origin, and bodies that are not JSON
        r = c.post("/console/api/session", json={"key": "x"}, headers={"Origin": evil})
        assert r.status_code == 403
        key = bare["tokens"]["read:N"]
        for content, kind in ((json.dumps({"key": key}), "text/plain"), (f"key={key}", None)):
            headers = {"Content-Type": kind or "application/x-www-form-urlencoded"}
            r = httpx.post(bare["url"] + "/console/api/session", content=content, headers=headers)
            assert r.status_code == 400 and "set-cookie" not in r.headers, r.text
        assert c.get("/console/api/session").status_code == 200  # still signed in


def test_the_session_cookie_is_httponly_samesite_strict_and_for_the_whole_site(
    bare: dict[str, Any],
) -> None:
    r = httpx.post(bare["url"] + "/console/api/session", json={"key": bare["tokens"]["read:N"]})
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    assert (
        "secure" not in cookie
    )  # plain http here; https: tests/integration/test_console_https_proxy.py
    value = r.cookies["radserve_session"]
    assert len(value) >= 40 and value not in r.text  # the id only in the cookie


def test_signing_in_ends_the_session_the_browser_held(bare: dict[str, Any]) -> None:
    """A shared workstation: an admin signs in, and later a reader signs in on the same
    browser without signing out. The admin's session must end there, not live on until
    its idle timeout for whoever kept its id."""
    c, _ = _session(bare, "admin")
    with closing(c):
        first = c.cookies["radserve_session"]
        r = c.post("/console/api/session", json={"key": bare["tokens"]["read:N"]})
        assert r.status_code == 200 and r.json()["role"] == "read"
        second = c.cookies["radserve_session"]
        assert second != first
        with httpx.Client(base_url=bare["url"], cookies={"radserve_session": first}) as old:
            assert old.get("/console/api/session").status_code == 401
            assert old.get("/v1/jobs").status_code == 401
        assert c.get("/console/api/session").json()["role"] == "read"
        # a failed sign-in leaves the session there is
        r = c.post("/console/api/session", json={"key": "rsk_0000000000000000_" + "A" * 43})
        assert r.status_code == 401
        assert c.get("/console/api/session").json()["role"] == "read"


def test_a_session_id_the_browser_was_given_beforehand_is_never_adopted(
    bare: dict[str, Any],
) -> None:
    """Fixation: an id planted in the browser before sign-in (by a sibling site's
    cookie) is not what the sign-in hands out, and never becomes valid."""
    planted = "attacker-chosen-session-id-0123456789abcdef"
    with httpx.Client(base_url=bare["url"], cookies={"radserve_session": planted}) as c:
        r = c.post("/console/api/session", json={"key": bare["tokens"]["read:N"]})
        assert r.status_code == 200
        assert r.cookies["radserve_session"] != planted
    with httpx.Client(base_url=bare["url"], cookies={"radserve_session": planted}) as c:
        assert c.get("/console/api/session").status_code == 401


def test_sign_out_needs_this_origin_and_ends_the_session_on_the_server(
    bare: dict[str, Any],
) -> None:
    c, csrf = _session(bare, "submit")
    with closing(c):
        held = c.cookies["radserve_session"]
        for headers in ({"Origin": "http://evil.example", "X-CSRF-Token": csrf}, {}):
            r = c.delete("/console/api/session", headers=headers)
            assert r.status_code == 403, (headers, r.status_code)
            assert c.get("/console/api/session").status_code == 200
        r = c.delete("/console/api/session", headers={"Origin": bare["url"], "X-CSRF-Token": csrf})
        assert r.status_code == 204
    # the id replayed (kept by someone, or the browser ignored the deleted cookie)
    with httpx.Client(base_url=bare["url"], cookies={"radserve_session": held}) as old:
        assert old.get("/console/api/session").status_code == 401
        assert old.get("/v1/jobs").status_code == 401
        assert old.get("/console/api/events").status_code == 401
        r = old.post(
            f"/v1/jobs/{bare['job']}/priority",
            json={"priority_class": "urgent"},
            headers={"Origin": bare["url"], "X-CSRF-Token": csrf},
        )
        assert r.status_code == 401


# --- path and id injection ----------------------------------------------------------------
HOSTILE = (
    "..",
    "%2e%2e",
    "..%2f..%2f..%2foutside.txt",
    "%2e%2e%2f%2e%2e%2f%2e%2e%2foutside.txt",
    "..%5c..%5coutside.txt",
    "%252e%252e%252foutside.txt",
    "%c0%ae%c0%ae%c0%afoutside.txt",  # overlong UTF-8
    "%ef%bc%8e%ef%bc%8e%ef%bc%8foutside.txt",  # fullwidth full stop and solidus
    "%e2%80%a4%e2%80%a4%e2%81%84outside.txt",  # one dot leader, fraction slash
    "report%e2%80%a4json",  # a look-alike of a real result file
    "%00",
    "report.json%00.dcm",
    "x" * 4000,
    "%ff%fe",
    "CON",
)


def _raw(live: dict[str, Any], method: str, target: str, body: bytes) -> tuple[int, bytes]:
    """``target`` sent as it is (no client normalises its dots or escapes)."""
    port = int(live["url"].rsplit(":", 1)[1])
    token = live["tokens"]["admin:N"]
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer "
        f"{token}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data[9:12]), data.partition(b"\r\n\r\n")[2]


@pytest.mark.slow
def test_every_path_parameter_refuses_traversal_nul_long_and_look_alike_values(
    live: dict[str, Any],
) -> None:
    """As admin (who may read everything): each hostile value in each parameter of each
    route answers a 4xx JSON error, and no answer holds the file outside the data folder."""
    outside = live["root"] / "outside.txt"
    assert outside.is_file() and live["data"] not in outside.parents
    wrong = []
    for (method, template), rule in ROUTES.items():
        names = re.findall(r"\{(\w+)\}", template)
        if method == "MOUNT":
            names, template = ["asset"], template + "/{asset}"
        for name in names:
            for value in HOSTILE:
                path = _path(live, template, **{name: value})
                body = json.dumps(rule.body or {}).encode() if method != "GET" else b""
                status, answer = _raw(live, method, path, body)
                if not 400 <= status < 500 or b"OUTSIDE-THE-DATA-FOLDER" in answer:
                    wrong.append(f"{method} {path[:120]} -> {status} {answer[:120]!r}")
                elif answer and json.loads(answer)["error"]["code"] is None:
                    wrong.append(f"{method} {path[:120]}: no error code")
    assert not wrong, "\n".join(wrong)
