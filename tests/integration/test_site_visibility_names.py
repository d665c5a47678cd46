"""Under ``security.visibility: site`` nothing a reader is shown names another site's job,
key or user, against the real app (console installed) over HTTP, with real jobs:

- A study of site A's, uploaded again by site B, is answered from A's cached result: B's
  job carried ``cached_from`` = A's job id (status, list, the submit answer, the
  console's worklist, event stream and study view), its audit trail did too, and its
  ``report.json`` (A's file, reused) named A's job as ``job_id``. Now each names that
  job only to who may see it (admins, site A); B's report names B's own job.
- The job's audit trail showed every record's key id, key name and client address: a
  site's reader saw the admin's and other keys' names. Now only actors the reader may
  see (the same rule as for jobs) are named; the rest are marked ``actor_hidden``.
- The console's local users had no site: a read user under the rule saw only the jobs
  it submitted itself (none), and a user's jobs were seen by no key of its site. A
  user's ``site`` now counts as a key's, both ways, in lists and single reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.factories.service import (
    ServerThread,
    auth,
    make_models_slow,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.passwords import hash_password
from radserve.service import Origin, Service

pytestmark = pytest.mark.slow

PASSWORD = "a-long-enough-password-1"
USERS = {  # name: (role, site)
    "ann": ("read", "A"),
    "bob": ("submit", "B"),
    "carl": ("read", None),
}
ADMIN_NAME = "admin of the whole server"


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=requires_postgres)]
)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        database = {}
        if request.param == "postgres":  # the listing's query with the users' ids
            database["database_url"] = stack.enter_context(postgres_schema("radserve_names"))
        yield from _server(tmp_path_factory.mktemp("site-names"), database)


def _server(root: Path, database: dict[str, str]) -> Iterator[dict[str, Any]]:
    digest = hash_password(PASSWORD)
    users = [
        {"username": n, "role": role, "password_hash": digest, **({"site": site} if site else {})}
        for n, (role, site) in USERS.items()
    ]
    service = Service(
        settings_for(root, security__visibility="site", console__users=users, **database)
    )
    app = create_app(service)
    install_console(app, service)

    def key(name: str, role: str, site: str | None = None) -> tuple[str, str]:
        record, token = service.store.create_api_key(name=name, role=role, site=site)
        return record.id, token

    ids, keys = {}, {}
    for name, role, site in (
        ("submit_a", "submit", "A"),
        ("submit_a2", "submit", "A"),
        ("read_a", "read", "A"),
        ("submit_b", "submit", "B"),
        ("read_b", "read", "B"),
        ("admin", "admin", None),
    ):
        ids[name], keys[name] = key(ADMIN_NAME if name == "admin" else f"key {name}", role, site)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        shared = make_study(root / "shared")
        files = upload(shared)
        first = c.post("/v1/studies", files=files, headers=auth(keys["submit_a"]))
        assert first.status_code == 202, first.text
        a1 = first.json()["id"]
        assert wait_job(c, a1, keys["submit_a"])["state"] == "succeeded"
        # the admin reads A's report: a phi.read by a key of no site in A's trail
        assert c.get(f"/v1/jobs/{a1}/report", headers=auth(keys["admin"])).status_code == 200
        # the same study from site B: run again, A's result is not B's to see
        b_run = c.post("/v1/studies", files=files, headers=auth(keys["submit_b"]))
        # the same study from site B, answered from A's cached result as it was before
        # session 37 (a job kept from then; since, B's upload runs again: test below)
        # and again from site A: answered from the cache
        b_job = _cached_before_session_37(service, ids["submit_b"], shared)
        b_answer = c.get(f"/v1/jobs/{b_job}", headers=auth(keys["submit_b"]))
        a_answer = c.post("/v1/studies", files=files, headers=auth(keys["submit_a2"]))
        assert (b_answer.status_code, a_answer.status_code) == (200, 200), b_answer.text
        # a study of bob's (a local user of site B), through his console session
        with _signed_in(srv.url, "bob") as (bob, csrf):
            r = bob.post(
                "/v1/studies",
                files=upload(make_study(root / "bob")),
                headers={"X-CSRF-Token": csrf},
            )
            assert r.status_code == 202, r.text
            u1 = r.json()["id"]
        assert wait_job(c, u1, keys["admin"])["state"] == "succeeded"
        yield {
            "url": srv.url,
            "client": c,
            "keys": keys,
            "key_ids": ids,
            "jobs": {"a1": a1, "b1": b_job, "a2": a_answer.json()["id"], "u1": u1},
            "answers": {"b1": b_answer.json(), "a2": a_answer.json(), "b_run": b_run},
            "shared": shared,
        }


def _cached_before_session_37(service: Service, key_id: str, files: list[Path]) -> str:
    """A job of ``key_id``'s answered from whatever result the cache holds for ``files``,
    as every submission was before session 37 (``Origin.sees`` unset): jobs like it stay
    in the store after an upgrade, naming another site's job as ``cached_from``."""
    resolved = service.intake.precheck(None, None)
    streams = [path.open("rb") for path in files]
    try:
        origin = Origin(key_id, "127.0.0.1")
        submission = service.intake.submit_upload(
            streams, resolved=resolved, priority=None, origin=origin
        )
    finally:
        for stream in streams:
            stream.close()
    assert submission.cached
    return submission.job.id


@contextmanager
def _signed_in(url: str, who: str) -> Iterator[tuple[httpx.Client, str]]:
    """A browser session: a local user by name, else the API key ``who`` of the test."""
    with httpx.Client(base_url=url, timeout=60) as c:
        body = {"username": who, "password": PASSWORD}
        r = c.post("/console/api/session", json=body)
        assert r.status_code == 200, r.text
        yield c, r.json()["csrf"]


@contextmanager
def _key_session(server: dict[str, Any], key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server["url"], timeout=60) as c:
        r = c.post("/console/api/session", json={"key": server["keys"][key]})
        assert r.status_code == 200, r.text
        yield c


def _get(server: dict[str, Any], key: str, path: str, **params: Any) -> httpx.Response:
    return server["client"].get(path, params=params, headers=auth(server["keys"][key]))


def _events(c: httpx.Client, wanted: str) -> str:
    """The console's event stream from its start until it sends a row of ``wanted``."""
    seen = ""
    with c.stream("GET", "/console/api/events", params={"since": 0}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            seen += line + "\n"
            if line.startswith("data:") and f'"id": "{wanted}"' in line:
                break
    return seen


def test_another_sites_result_is_not_reused(server: dict[str, Any]) -> None:
    """Site B uploading a study site A's job analysed gets no instant "cached" answer: it
    told B that another site had analysed exactly this study (its patient had been
    there). B's study runs again; B's next upload of it reuses B's own result."""
    run = server["answers"]["b_run"]
    assert run.status_code == 202, run.text
    assert run.json()["cached"] is False and run.json()["cached_from"] is None
    b_run = run.json()["id"]
    c, keys = server["client"], server["keys"]
    assert wait_job(c, b_run, keys["submit_b"])["state"] == "succeeded"
    files = upload(server["shared"])
    again = c.post("/v1/studies", files=files, headers=auth(keys["submit_b"]))
    assert again.status_code == 200 and again.json()["cached"] is True, again.text
    assert again.json()["cached_from"] == b_run


def test_a_cached_job_names_the_earlier_job_only_to_who_may_see_it(
    server: dict[str, Any],
) -> None:
    jobs = server["jobs"]
    a1, b1, a2 = jobs["a1"], jobs["b1"], jobs["a2"]
    # site B's job kept from before session 37: cached, from a job B may not see
    answer = server["answers"]["b1"]
    assert answer["cached"] is True and answer["cached_from"] is None
    assert a1 not in json.dumps(answer)
    # site A's own repeat is told where its result came from
    assert server["answers"]["a2"]["cached_from"] == a1

    for key in ("read_b", "submit_b"):
        status = _get(server, key, f"/v1/jobs/{b1}")
        assert status.status_code == 200
        assert status.json()["cached"] is True and status.json()["cached_from"] is None
        assert a1 not in status.text
        listed = _get(server, key, "/v1/jobs")
        assert b1 in listed.text and a1 not in listed.text
        report = _get(server, key, f"/v1/jobs/{b1}/report")
        assert report.status_code == 200 and a1 not in report.text
        assert report.json()["job_id"] == b1
        # the rest of the report is A's result as it was
        original = _get(server, "admin", f"/v1/jobs/{b1}/report").json()
        assert original["job_id"] == a1
        assert {**report.json(), "job_id": a1} == original

    # who may see the earlier job is told (an admin; a key of site A)
    assert _get(server, "admin", f"/v1/jobs/{b1}").json()["cached_from"] == a1
    assert _get(server, "read_a", f"/v1/jobs/{a2}").json()["cached_from"] == a1
    assert _get(server, "read_a", f"/v1/jobs/{a2}/report").json()["job_id"] == a1
    assert _get(server, "read_a", f"/v1/jobs/{b1}").status_code == 404

    # the console: worklist, study view (row, report, audit trail, report.json), events
    with _key_session(server, "read_b") as c:
        worklist = c.get("/console/api/worklist")
        assert b1 in worklist.text and a1 not in worklist.text
        detail = c.get(f"/console/api/jobs/{b1}")
        assert detail.status_code == 200 and a1 not in detail.text
        assert detail.json()["job"]["cached"] is True
        assert detail.json()["report"]["job_id"] == b1
        assert any(r["action"] == "job.cached" for r in detail.json()["trail"])
        download = c.get(f"/console/api/jobs/{b1}/files/report.json")
        assert download.status_code == 200 and a1 not in download.text
        assert json.loads(download.content)["job_id"] == b1
        assert a1 not in _events(c, b1)
    with _key_session(server, "admin") as c:
        detail = c.get(f"/console/api/jobs/{b1}").json()
        assert detail["job"]["cached_from"] == a1
        cached = [r for r in detail["trail"] if r["action"] == "job.cached"]
        assert cached and cached[0]["payload"]["cached_from"] == a1


def test_the_audit_trail_names_only_actors_the_reader_may_see(server: dict[str, Any]) -> None:
    a1 = server["jobs"]["a1"]
    admin_id = server["key_ids"]["admin"]
    with _key_session(server, "read_a") as c:
        detail = c.get(f"/console/api/jobs/{a1}")
        assert detail.status_code == 200
        trail = detail.json()["trail"]
        assert ADMIN_NAME not in detail.text and admin_id not in detail.text
        reads = [r for r in trail if r["action"] == "phi.read"]
        hidden = [r for r in reads if r["actor_hidden"]]
        # the admin's read is there (what and when), not who made it or from where
        assert len(hidden) == 1
        assert hidden[0]["actor_key_id"] is None and hidden[0]["client"] is None
        assert hidden[0]["payload"] == {"resource": "report"}
        # its own site's records keep their actor: the submitter's, this session's read
        submitted = next(r for r in trail if r["action"] == "job.submitted")
        assert submitted["actor_key_id"] == server["key_ids"]["submit_a"]
        assert not submitted["actor_hidden"]
        own = [r for r in reads if r["actor_key_id"] == server["key_ids"]["read_a"]]
        assert own and own[0]["payload"]["key_name"] == "key read_a"
    # ann, a local user of site A, the same; an admin sees every actor
    with _signed_in(server["url"], "ann") as (c, _):
        detail = c.get(f"/console/api/jobs/{a1}")
        assert detail.status_code == 200 and ADMIN_NAME not in detail.text
    with _key_session(server, "admin") as c:
        detail = c.get(f"/console/api/jobs/{a1}")
        assert ADMIN_NAME in detail.text and admin_id in detail.text
        assert not any(r["actor_hidden"] for r in detail.json()["trail"])


def test_local_users_carry_a_site_as_keys_do(server: dict[str, Any]) -> None:
    jobs = server["jobs"]
    a1, a2, b1, u1 = jobs["a1"], jobs["a2"], jobs["b1"], jobs["u1"]
    # ann (read, site A) sees site A's jobs, not B's nor bob's
    with _signed_in(server["url"], "ann") as (c, _):
        assert c.get("/console/api/session").json()["site"] == "A"
        listed = {j["id"] for j in c.get("/console/api/worklist").json()["items"]}
        assert listed == {a1, a2}
        api_listed = {j["id"] for j in c.get("/v1/jobs").json()["items"]}
        assert api_listed == {a1, a2}
        assert c.get(f"/v1/jobs/{a1}/report").status_code == 200
        assert c.get(f"/v1/jobs/{b1}").status_code == 404
        assert c.get(f"/console/api/jobs/{u1}").status_code == 404
    # bob (submit, site B) sees his own and site B's
    with _signed_in(server["url"], "bob") as (c, _):
        listed = {j["id"] for j in c.get("/console/api/worklist").json()["items"]}
        # (and the jobs of site B's keys that ran A's study again: no site A job)
        assert {b1, u1} <= listed and not {a1, a2} & listed
        assert c.get(f"/v1/jobs/{a1}").status_code == 404
    # carl (read, no site) sees nothing, as a key without a site would
    with _signed_in(server["url"], "carl") as (c, _):
        assert c.get("/console/api/session").json()["site"] is None
        assert c.get("/console/api/worklist").json()["items"] == []
    # bob's job is site B's for keys too: listed and readable by B, not by A
    assert u1 in _get(server, "read_b", "/v1/jobs").text
    assert _get(server, "read_b", f"/v1/jobs/{u1}/report").status_code == 200
    assert u1 not in _get(server, "read_a", "/v1/jobs").text
    assert _get(server, "read_a", f"/v1/jobs/{u1}").status_code == 404
    # and the key of site B reading bob's trail sees bob named (same site)
    with _key_session(server, "read_b") as c:
        trail = c.get(f"/console/api/jobs/{u1}").json()["trail"]
        submitted = next(r for r in trail if r["action"] == "job.submitted")
        assert submitted["actor_key_id"] == "user:bob" and not submitted["actor_hidden"]


def test_model_changes_name_the_admin_only_to_who_may_see_it(server: dict[str, Any]) -> None:
    """A deployment change names the admin key that made it (``actor``): shown to
    admins, not to a site's reader (the same rule as the audit trail's actors)."""
    admin_id = server["key_ids"]["admin"]
    body = {"version": "1.0.0", "role": "stable", "reason": "the same version again"}
    changed = server["client"].post(
        "/v1/models/lesions-test/deploy", json=body, headers=auth(server["keys"]["admin"])
    )
    assert changed.status_code == 200 and changed.json()["actor"] == admin_id
    for path in ("/v1/models", "/v1/models/deployments"):
        seen = _get(server, "read_b", path)
        assert seen.status_code == 200 and admin_id not in seen.text, path
        assert admin_id in _get(server, "admin", path).text, path
    deployments = _get(server, "read_b", "/v1/models").json()["deployments"]
    step = next(d for d in deployments if d["step"] == "lesions-test")
    assert step["actor"] is None and step["reason"] == "the same version again"


def test_the_jobs_at_risk_are_listed_only_to_who_may_see_them(tmp_path: Path) -> None:
    """``GET /v1/ops/turnaround`` lists the unfinished jobs a deadline risk stands for:
    every site's job ids went to every reader. Jobs here are slow (a heavy test model,
    one at a time) and predicted late (a slow prior, a 30 s OUTPATIENT TAT), so they stand
    at risk a while."""
    settings = settings_for(
        tmp_path,
        security__visibility="site",
        turnaround__prior_per_slice_s=5.0,
        turnaround__risk_margin_s=0.1,
        scheduler__tat_s__outpatient=30,
        turnaround__recompute_interval_s=0.05,
        scheduler__max_running=1,
    )
    make_models_slow(tmp_path / "assets" / "models", layers=8, channels=192)
    service = Service(settings)
    keys = {}
    for name, role, site in (("a", "submit", "A"), ("b", "submit", "B"), ("admin", "admin", None)):
        keys[name] = service.store.create_api_key(name=name, role=role, site=site)[1]
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
        ids: dict[str, list[str]] = {"a": [], "b": []}
        for i, site in enumerate(("a", "a", "b", "a")):
            r = c.post(
                "/v1/studies",
                files=upload(make_study(tmp_path / f"s{i}")),
                headers=auth(keys[site]),
            )
            assert r.status_code == 202, r.text
            ids[site].append(r.json()["id"])

        def at_risk(key: str) -> set[str]:
            r = c.get("/v1/ops/turnaround", headers=auth(keys[key]))
            assert r.status_code == 200, r.text
            return set(r.json()["at_risk"])

        checked = False
        for _ in range(400):
            before, seen_b, after = at_risk("admin"), at_risk("b"), at_risk("admin")
            assert not seen_b & set(ids["a"]), seen_b  # never another site's job
            assert seen_b <= set(ids["b"])
            # a job of site A at risk before and after B's look: B was not told of it
            if before & after & set(ids["a"]):
                checked = True
                break
            time.sleep(0.02)
        assert checked, "no job of site A stood at risk while site B looked"
        for site in ("a", "b"):
            for job_id in ids[site]:
                wait_job(c, job_id, keys[site], timeout=120)
