"""The console's worklist over thousands of jobs, against the real app over HTTP on
SQLite and PostgreSQL, ``security.visibility: site``.

A hospital writes tens of thousands of jobs a month. The worklist answered the newest
200 (at most 1,000) with no sign that older ones existed, and its accession search
looked only through the newest 1,000 jobs' study headers: last month's accession was
silently not found. Now the search is in the query over every job the reader may see,
and ``has_more`` / ``next`` page through the rest, each job exactly once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.postgres import postgres_schema, requires_postgres
from tests.factories.service import ServerThread, auth, make_study, settings_for, upload
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.service import Service
from radserve.store import JobState

pytestmark = pytest.mark.slow

JOBS = 2500  # more than the 1,000 the old search looked through
EVERY_THIRD_TO_SITE_S = 3
# jobs from before revision 0020: no accession on the row, read from the study
OLD_ACCESSION = "OLDROW-77"


def _accession(i: int) -> str:
    return f"ACC{i:06d}"


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=requires_postgres)]
)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        database = {}
        if request.param == "postgres":
            database["database_url"] = stack.enter_context(postgres_schema("radserve_paging"))
        yield from _server(tmp_path_factory.mktemp("worklist-paging"), database)


def _server(root: Path, database: dict[str, str]) -> Iterator[dict[str, Any]]:
    service = Service(settings_for(root, security__visibility="site", **database))
    app = create_app(service)
    install_console(app, service)
    store = service.store
    keys = {}
    key_ids = {}
    for name, role, site in (
        ("submit_n", "submit", "N"),
        ("submit_s", "submit", "S"),
        ("read_n", "read", "N"),
        ("admin", "admin", None),
    ):
        record, keys[name] = store.create_api_key(name=name, role=role, site=site)
        key_ids[name] = record.id
    fields: dict[str, Any] = {
        "priority_class": "OUTPATIENT",
        "deadline": dt.timedelta(minutes=30),
        "pipeline_name": "test-pipeline",
        "pipeline_version": "1",
        "precision": "fp32",
        "fingerprint": "0" * 64,
    }
    # one finished job whose result the others reuse: they are born succeeded, so the
    # server runs none of them
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    source = store.create_job(
        **fields,
        study_path=str(root / "no-study"),
        arrival=start - dt.timedelta(minutes=1),
        api_key_id=key_ids["submit_n"],
        accession="SOURCE",
    )
    store.transition(source.id, JobState.QUEUED)
    store.transition(source.id, JobState.RUNNING)
    store.record_result(source.id, str(root / "result"))
    sites: dict[str, str] = {source.id: "N"}
    accessions: dict[str, str] = {source.id: "SOURCE"}
    for i in range(JOBS):
        site = "S" if i % EVERY_THIRD_TO_SITE_S == 0 else "N"
        # two jobs at each minute: the page cursor must tell them apart by id
        job = store.create_job(
            **fields,
            study_path=str(root / "no-study"),
            arrival=start + dt.timedelta(minutes=i // 2),
            api_key_id=key_ids[f"submit_{site.lower()}"],
            cached_from=source.id,
            accession=_accession(i),
        )
        sites[job.id] = site
        accessions[job.id] = _accession(i)
    # a job written before the accession was on the row (None): found once read
    study = root / "old-study"
    make_study(study, extra={"AccessionNumber": OLD_ACCESSION})
    old = store.create_job(
        **fields,
        study_path=str(study),
        arrival=start - dt.timedelta(days=1),
        api_key_id=key_ids["submit_n"],
        cached_from=source.id,
    )
    assert old.accession is None
    sites[old.id] = "N"
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield {
            "client": c,
            "keys": keys,
            "sites": sites,
            "accessions": accessions,
            "old": old.id,
            "service": service,
            "root": root,
        }


def _page(server: dict[str, Any], key: str, **params: Any) -> dict[str, Any]:
    r = server["client"].get(
        "/console/api/worklist", params=params, headers=auth(server["keys"][key])
    )
    assert r.status_code == 200, r.text[:500]
    body: dict[str, Any] = r.json()
    return body


def _all_pages(server: dict[str, Any], key: str, **params: Any) -> list[dict[str, Any]]:
    """Every row, following ``next`` until ``has_more`` is false."""
    rows: list[dict[str, Any]] = []
    cursor = None
    for _ in range(JOBS):  # bounded: a cursor that never ends fails the test
        page = _page(server, key, **params, **({"cursor": cursor} if cursor else {}))
        rows += page["items"]
        assert page["has_more"] is (page["next"] is not None)
        if not page["has_more"]:
            return rows
        cursor = page["next"]
    raise AssertionError("the worklist's pages never ended")


def test_an_accession_older_than_the_newest_thousand_jobs_is_found(
    server: dict[str, Any],
) -> None:
    oldest = _page(server, "admin", accession=_accession(1).lower())
    assert [r["accession"] for r in oldest["items"]] == [_accession(1)]
    assert oldest["has_more"] is False and oldest["next"] is None


def test_a_search_finds_only_the_jobs_the_reader_may_see(server: dict[str, Any]) -> None:
    # ACC000100 to ACC000199: 100 jobs, 33 of them site S's
    rows = _all_pages(server, "read_n", accession="acc0001", limit=7)
    wanted = {
        job_id
        for job_id, number in server["accessions"].items()
        if number.startswith("ACC0001") and server["sites"][job_id] == "N"
    }
    assert len(wanted) == 67
    assert [r["id"] for r in rows if r["id"] in wanted] == [r["id"] for r in rows]
    assert sorted(r["id"] for r in rows) == sorted(wanted)


def test_a_search_takes_percent_and_underscore_as_characters(server: dict[str, Any]) -> None:
    assert _page(server, "admin", accession="ACC%1")["items"] == []
    assert _page(server, "admin", accession="ACC_00001")["items"] == []


def test_the_first_page_says_there_are_more(server: dict[str, Any]) -> None:
    page = _page(server, "admin")
    assert len(page["items"]) == 200
    assert page["has_more"] is True and page["next"]


def test_paging_returns_every_visible_job_exactly_once_newest_first(
    server: dict[str, Any],
) -> None:
    rows = _all_pages(server, "read_n", limit=1000)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    assert set(ids) == {job_id for job_id, site in server["sites"].items() if site == "N"}
    order = [(r["arrival"], r["id"]) for r in rows]
    assert order == sorted(order, reverse=True)


def test_a_job_from_before_the_accession_column_is_found_once_read(
    server: dict[str, Any],
) -> None:
    # the first worklist request starts the fill of rows without an accession
    def found() -> bool:
        rows = _page(server, "read_n", accession=OLD_ACCESSION.lower())["items"]
        return [r["id"] for r in rows] == [server["old"]]

    until(found, "the old job's accession number read into its row", timeout=60, step=0.2)
    row = _page(server, "admin", accession=OLD_ACCESSION)["items"][0]
    assert row["accession"] == OLD_ACCESSION


def test_an_edited_cursor_is_a_clear_400(server: dict[str, Any]) -> None:
    r = server["client"].get(
        "/console/api/worklist",
        params={"cursor": "not-a-cursor"},
        headers=auth(server["keys"]["admin"]),
    )
    assert r.status_code == 400, r.text
    assert "cursor" in r.json()["error"]["message"]


def test_a_submitted_study_s_accession_is_written_on_its_row(server: dict[str, Any]) -> None:
    service: Service = server["service"]
    assert service.wait_warm(60 * WAIT_SCALE)
    files = make_study(server["root"] / "new-study", extra={"AccessionNumber": " NEW-0042 "})
    r = server["client"].post(
        "/v1/studies?priority=outpatient",
        files=upload(files),
        headers=auth(server["keys"]["submit_n"]),
    )
    assert r.status_code == 202, r.text
    assert service.store.get_job(r.json()["id"]).accession == "NEW-0042"
    found = _page(server, "read_n", accession="new-0042")["items"]
    assert [row["id"] for row in found] == [r.json()["id"]]
