"""What a job whose result the retention policy removed (``storage.result_retention_days``)
answers: its result endpoints (report, label map, key image, FHIR Bundle) 410
``result_removed`` naming the policy and the date, and ``GET /v1/jobs/{id}`` lists the
removal among its warnings; a result missing for another reason still answers 404.
Before, a removed result answered 404 "its report file is missing", as if the job never
had one. The sweep records the removal on every job the folder served (a cached answer
too), on SQLite and PostgreSQL, and only when it removes the folder."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.factories.postgres import store_on
from tests.factories.retention import (
    age,
    at,
    new_job,
    stored_study,
    succeed,
    sweeper,
)
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.service import Service
from radserve.service.job_view import RESULT_REMOVED, result_removed
from radserve.store import JobRecord, Store

RESULTS = {"result_retention_days": 30}


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_result_removed") as opened:
        yield opened


def _date(clock: float) -> str:
    return dt.datetime.fromtimestamp(clock, dt.UTC).date().isoformat()


def test_the_sweep_records_the_removal_on_every_job_the_result_served(
    store: Store, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    study = stored_study(data, tmp_path / "in", 1)
    owner = new_job(store, study)
    result = data / "results" / owner
    succeed(store, owner, result, study)
    copy = new_job(store, study, cached_from=owner)  # answered from the owner's result
    clock = at(31)

    sweeper(data, store, clock=clock, **RESULTS).sweep(dry_run=True)
    assert result.is_dir() and result_removed(store.get_job(owner)) is None  # a dry run

    told: list[JobRecord] = []
    done = sweeper(data, store, clock=clock, on_result_removed=told.append, **RESULTS).sweep()
    assert done.removed["results"].folders == 1 and not result.exists()
    expected = (
        "this job's result was removed by the retention policy "
        f"(storage.result_retention_days) on {_date(clock())}"
    )
    for job_id in (owner, copy):
        record = store.get_job(job_id)
        assert result_removed(record) == expected
        codes = [w["code"] for w in record.queue_meta["warnings"]]
        assert codes == [RESULT_REMOVED]  # once, not once per pass
    # the records as written, for the caller's job cache; newer than the ones it held
    assert sorted(r.id for r in told) == sorted([owner, copy])
    assert all(result_removed(r) == expected for r in told)
    assert sweeper(data, store, clock=at(40), **RESULTS).sweep().total == 0


def test_a_leftover_folder_of_another_run_marks_no_job(store: Store, tmp_path: Path) -> None:
    """``results/<job id>.<n>``, a run whose result was never recorded (a job taken
    over): removing it leaves the job's own result, and its answers, as they were."""
    data = tmp_path / "data"
    study = stored_study(data, tmp_path / "in", 1)
    job_id = new_job(store, study)
    result = data / "results" / job_id
    succeed(store, job_id, result, study)
    leftover = data / "results" / f"{job_id}.1"
    leftover.mkdir()
    (leftover / "report.json").write_text("{}")
    age(result, 31)  # touched an hour "before" the pass: not old enough, kept
    done = sweeper(data, store, days=31 + 1 / 24, **RESULTS).sweep()
    assert done.removed["results"].folders == 1 and not leftover.exists() and result.is_dir()
    assert result_removed(store.get_job(job_id)) is None


def test_a_removed_result_answers_410_naming_the_policy_and_the_job_says_so(
    tmp_path: Path,
) -> None:
    """Through the API, with the sweep as the service runs it (no cache wiring): one job
    whose report was read before (its record and report in the server's memory), one
    never read, one whose result folder was deleted by hand (not by the policy)."""
    service = Service(settings_for(tmp_path))
    key = create_key(service.store, "submit")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        ids = []
        for name in ("read", "unread", "by-hand"):
            files = upload(make_study(tmp_path / name))
            ids.append(c.post("/v1/studies", files=files, headers=auth(key)).json()["id"])
        for job_id in ids:
            assert wait_job(c, job_id, key)["state"] == "succeeded"
        read, unread, by_hand = ids
        assert c.get(f"/v1/jobs/{read}/report", headers=auth(key)).status_code == 200
        shutil.rmtree(str(service.store.get_job(by_hand).result_path))

        clock = at(31)
        policy = sweeper(service.settings.data_dir, service.store, clock=clock, **RESULTS)
        assert policy.sweep().removed["results"].folders == 2
        on = _date(clock())

        for job_id in (unread, read):  # unread first: its record only is stale in memory
            for path in ("labels", "report", "images/1", "fhir"):
                answer = c.get(f"/v1/jobs/{job_id}/{path}", headers=auth(key))
                assert answer.status_code == 410, (path, answer.text)
                error = answer.json()["error"]
                assert error["code"] == "result_removed"
                assert "retention policy (storage.result_retention_days)" in error["message"]
                assert f"on {on}" in error["message"]
            job = c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
            assert job["state"] == "succeeded"
            removed = [w for w in job["warnings"] if w["code"] == "result_removed"]
            assert len(removed) == 1 and f"on {on}" in removed[0]["message"]
            # its links offer no endpoint that answers 410, in the job and in the list
            assert job["links"] == {"self": f"/v1/jobs/{job_id}"}
            listed = c.get("/v1/jobs", headers=auth(key)).json()
            assert next(j for j in listed["items"] if j["id"] == job_id)["links"] == job["links"]

        # a result gone for another reason is not blamed on the policy
        missing = c.get(f"/v1/jobs/{by_hand}/report", headers=auth(key))
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "output_not_found"
        job = c.get(f"/v1/jobs/{by_hand}", headers=auth(key)).json()
        assert not [w for w in job["warnings"] if w["code"] == "result_removed"]
        assert "report" in job["links"]
