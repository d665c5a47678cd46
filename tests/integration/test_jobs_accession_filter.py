"""``GET /v1/jobs?accession=``: an integration engine that holds an order's Accession
Number finds its jobs in one call, on SQLite and PostgreSQL, against the real app over
HTTP, ``security.visibility: site``.

The match is exact, case as stored (an engine sends the number it has; ``acc-1`` must
not answer ``ACC-1``'s jobs, nor ``ACC`` every job), the visibility rule holds (a site
finds none of another site's jobs by their number) and the pages keep their cursor.
Before, the parameter was ignored: the answer was every job the key may see.
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
from tests.factories.service import ServerThread, auth, make_study, settings_for
from tests.factories.waits import until

from radserve.api import create_app
from radserve.console import install as install_console
from radserve.service import Service
from radserve.store import JobState

SHARED = "ACC-7"  # on five of north's jobs and three of south's
SOUTH_ONLY = "S-ONLY-1"
OLD = "OLDROW-9"  # a job from before revision 0020: no number on its row yet


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=requires_postgres)]
)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        database = {}
        if request.param == "postgres":
            database["database_url"] = stack.enter_context(postgres_schema("radserve_acc_api"))
        yield from _server(tmp_path_factory.mktemp("jobs-accession"), database)


def _server(root: Path, database: dict[str, str]) -> Iterator[dict[str, Any]]:
    service = Service(settings_for(root, security__visibility="site", **database))
    app = create_app(service)
    install_console(app, service)  # the fill of old rows' numbers is the console's
    store = service.store
    keys, key_ids = {}, {}
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
        "study_path": str(root / "no-study"),
    }
    # one finished job whose result the others reuse: born succeeded, none runs
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
    source = store.create_job(
        **fields, arrival=start, api_key_id=key_ids["submit_n"], accession="SOURCE"
    )
    store.transition(source.id, JobState.QUEUED)
    store.transition(source.id, JobState.RUNNING)
    store.record_result(source.id, str(root / "result"))
    made: dict[str, tuple[str, str | None]] = {}  # job id -> (site, accession)
    rows = [("N", SHARED)] * 5 + [("S", SHARED)] * 3 + [("S", SOUTH_ONLY)]
    rows += [("N", "acc-7"), ("N", "ACC-70"), ("N", "XACC-7"), ("N", "ACC_7"), ("N", "")]
    for i, (site, accession) in enumerate(rows):
        job = store.create_job(
            **fields,
            arrival=start + dt.timedelta(minutes=1 + i // 2),  # pairs: the id breaks ties
            api_key_id=key_ids[f"submit_{site.lower()}"],
            cached_from=source.id,
            accession=accession,
        )
        made[job.id] = (site, accession)
    study = root / "old-study"
    make_study(study, extra={"AccessionNumber": OLD})
    old = store.create_job(
        **{**fields, "study_path": str(study)},
        arrival=start + dt.timedelta(minutes=30),
        api_key_id=key_ids["submit_n"],
        cached_from=source.id,
    )
    assert old.accession is None
    made[old.id] = ("N", None)
    try:
        with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            yield {"client": c, "keys": keys, "made": made, "old": old.id}
    finally:
        service.stop()


def _get(server: dict[str, Any], key: str, **params: Any) -> httpx.Response:
    return server["client"].get("/v1/jobs", params=params, headers=auth(server["keys"][key]))


def _ids(server: dict[str, Any], key: str, **params: Any) -> list[str]:
    """Every job id of every page, following ``next_cursor``."""
    ids: list[str] = []
    cursor = None
    for _ in range(50):  # bounded: a cursor that never ends fails the test
        r = _get(server, key, **params, **({"cursor": cursor} if cursor else {}))
        assert r.status_code == 200, r.text[:500]
        body = r.json()
        ids += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return ids
    raise AssertionError("the pages never ended")


def _made(server: dict[str, Any], accession: str, site: str | None = None) -> set[str]:
    return {
        job_id
        for job_id, (s, number) in server["made"].items()
        if number == accession and site in (None, s)
    }


def test_the_accession_is_matched_exactly_with_its_case(server: dict[str, Any]) -> None:
    ids = _ids(server, "admin", accession=SHARED)
    assert sorted(ids) == sorted(_made(server, SHARED))
    assert len(ids) == 8  # not acc-7, ACC-70, XACC-7, ACC_7 nor the others
    assert _ids(server, "admin", accession="acc-7") == sorted(_made(server, "acc-7"))
    assert _ids(server, "admin", accession="ACC") == []  # no substring
    assert _ids(server, "admin", accession="ACC%7") == []  # no pattern
    # DICOM pads a number with spaces; the row holds it stripped
    assert sorted(_ids(server, "admin", accession=f" {SHARED} ")) == sorted(ids)


def test_a_site_finds_none_of_another_site_s_jobs_by_accession(
    server: dict[str, Any],
) -> None:
    assert sorted(_ids(server, "read_n", accession=SHARED)) == sorted(_made(server, SHARED, "N"))
    r = _get(server, "read_n", accession=SOUTH_ONLY)
    assert r.status_code == 200, r.text
    assert r.json() == {"items": [], "next_cursor": None}  # not a 404 that says it exists
    assert _ids(server, "submit_s", accession=SOUTH_ONLY) == list(_made(server, SOUTH_ONLY))


def test_pages_of_an_accession_hold_each_job_once_newest_first(
    server: dict[str, Any],
) -> None:
    first = _get(server, "admin", accession=SHARED, limit=3)
    assert first.status_code == 200, first.text
    assert len(first.json()["items"]) == 3 and first.json()["next_cursor"]
    ids = _ids(server, "admin", accession=SHARED, limit=3)
    assert len(ids) == len(set(ids)) == 8
    whole = _get(server, "admin", accession=SHARED, limit=8).json()["items"]
    order = [(item["arrival"], item["id"]) for item in whole]
    assert [job_id for _, job_id in order] == ids
    assert order == sorted(order, reverse=True)
    # with the other filters: north's five under the site rule, three a page
    assert len(_ids(server, "read_n", accession=SHARED, limit=3, state="succeeded")) == 5


def test_an_empty_accession_is_a_clear_400(server: dict[str, Any]) -> None:
    for empty in ("", "   "):
        r = _get(server, "admin", accession=empty)
        assert r.status_code == 400, r.text
        assert "accession" in r.json()["error"]["message"]


def test_a_job_from_before_the_accession_column_is_found_once_its_number_is_read(
    server: dict[str, Any],
) -> None:
    # the first such request starts the background fill of rows without a number
    until(
        lambda: _ids(server, "read_n", accession=OLD) == [server["old"]],
        "the old job's accession number read into its row",
        timeout=60,
        step=0.2,
    )
