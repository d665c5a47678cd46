"""The same study submitted again while its first job is still unfinished is answered by
that job, through a real server (on SQLite and on PostgreSQL).

Before, every submission whose input had no succeeded result yet made a job of its own:
the same study sent twice at once (a client retrying, two modalities' routes, two
replicas behind a load balancer) ran twice and made two results. Now a submitter who may
see the unfinished job gets it back (202, its id; a ``job.joined`` audit record), a more
urgent one raises it (``job.reprioritised``, reason ``duplicate_submission``), and a
submitter of another site (``security.visibility: site``) still gets a job of its own, so
the answer does not tell it that another site has that study."""

from __future__ import annotations

import threading
from collections import Counter
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
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.domain.priority import PriorityClass
from radserve.service import Origin, Service
from radserve.store import JobState
from radserve.store.files import STAGING_DIR, STUDIES_DIR

pytestmark = pytest.mark.slow


DATABASES = ["sqlite", pytest.param("postgres", marks=requires_postgres)]


@contextmanager
def _serving(database: str, root: Path, **settings: Any) -> Iterator[dict[str, Any]]:
    """A server on ``database`` (``security.visibility: site``) with submit keys a1, a2
    (site A) and b (site B)."""
    with ExitStack() as stack:
        if database == "postgres":
            settings["database_url"] = stack.enter_context(postgres_schema("radserve_dup"))
        service = Service(settings_for(root, security__visibility="site", **settings))
        keys = {
            name: service.store.create_api_key(name=name, role="submit", site=site)[1]
            for name, site in (("a1", "A"), ("a2", "A"), ("b", "B"))
        }
        srv = stack.enter_context(ServerThread(create_app(service)))
        client = stack.enter_context(httpx.Client(base_url=srv.url, timeout=120))
        assert service.wait_warm(60 * WAIT_SCALE)
        yield {"service": service, "client": client, "keys": keys, "root": root}


@pytest.fixture(params=DATABASES)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with _serving(request.param, tmp_path) as serving:
        yield serving


@pytest.fixture(params=DATABASES)
def full_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """One OUTPATIENT study fills its queue."""
    with _serving(request.param, tmp_path, scheduler__queue_limits__outpatient=1) as serving:
        yield serving


def _submit(c: httpx.Client, files: list[Any], token: str, priority: str) -> httpx.Response:
    return c.post(f"/v1/studies?priority={priority}", files=files, headers=auth(token))


def test_a_study_sent_again_while_its_job_waits_is_answered_by_that_job(
    server: dict[str, Any],
) -> None:
    service, c, keys = server["service"], server["client"], server["keys"]
    files = upload(make_study(server["root"] / "study"))
    service.scheduler.hold("test", "the first job stays waiting")
    try:
        first = _submit(c, files, keys["a1"], "outpatient")
        assert first.status_code == 202, first.text
        job_id = first.json()["id"]

        # the same study twice more at once, by the same key and another key of site A
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda token=token: answers.append(_submit(c, files, token, "outpatient"))
            )
            for token in (keys["a1"], keys["a2"])
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120 * WAIT_SCALE)
        assert [(r.status_code, r.json()["id"]) for r in answers] == [(202, job_id)] * 2
        assert all(r.json()["cached"] is False for r in answers)

        # site B may not see A's job: it gets its own, and nothing of A's
        other = _submit(c, files, keys["b"], "outpatient")
        assert other.status_code == 202, other.text
        other_id = other.json()["id"]
        assert other_id != job_id and job_id not in other.text

        # a more urgent second submission raises the waiting job, audited
        urgent = _submit(c, files, keys["a2"], "urgent")
        assert (urgent.status_code, urgent.json()["id"]) == (202, job_id)
        assert urgent.json()["priority_class"] == "URGENT"
        info = service.scheduler.job_info(job_id)
        assert info is not None and info.cls is PriorityClass.URGENT
        row = service.store.get_job(job_id)
        assert row.priority_class is PriorityClass.URGENT
        tat = service.scheduler.config.tat(PriorityClass.URGENT)
        assert abs((row.deadline - row.arrival).total_seconds() - tat) < 1e-3

        a2_id = keys["a2"].split("_")[1]
        records = [r for r in service.store.iter_audit() if r.subject == job_id]
        joined = [r for r in records if r.action == "job.joined"]
        assert len(joined) == 3
        assert {r.payload["priority_class_asked"] for r in joined} == {"OUTPATIENT", "URGENT"}
        [raised] = [r for r in records if r.action == "job.reprioritised"]
        assert raised.actor_key_id == a2_id
        assert raised.payload["reason"] == "duplicate_submission"
        assert (raised.payload["old_priority_class"], raised.payload["new_priority_class"]) == (
            "OUTPATIENT",
            "URGENT",
        )
        jobs = service.store.list_jobs(limit=20).items
        assert sorted(j.id for j in jobs) == sorted([job_id, other_id])
    finally:
        service.scheduler.release()

    assert wait_job(c, job_id, keys["a2"], timeout=300 * WAIT_SCALE)["state"] == "succeeded"
    assert wait_job(c, other_id, keys["b"], timeout=300 * WAIT_SCALE)["state"] == "succeeded"
    # once it succeeded, the same study is answered from its result as before
    cached = _submit(c, files, keys["a2"], "outpatient")
    assert cached.status_code == 200 and cached.json()["cached_from"] == job_id


def _study_folders(service: Service) -> set[Path]:
    return {p for p in (service.settings.data_dir / STUDIES_DIR).glob("*/*") if p.is_dir()}


def test_a_study_sent_again_to_a_full_queue_is_answered_by_its_job_and_others_refused(
    full_server: dict[str, Any],
) -> None:
    """A RIS re-sending a study it got no answer for, while the queue is full: before, it
    got 503 queue_full (the upload's queue place was reserved before its input was known;
    with ``?priority=`` before a byte was read) for a study that was in fact queued."""
    service, c, keys = full_server["service"], full_server["client"], full_server["keys"]
    root = full_server["root"]
    files = upload(make_study(root / "study"))
    service.scheduler.hold("test", "the first job stays waiting")
    try:
        first = _submit(c, files, keys["a1"], "outpatient")
        assert first.status_code == 202, first.text
        job_id = first.json()["id"]
        stored = _study_folders(service)

        # the queue is full now; the same study again, stated class or by the rules
        again = _submit(c, files, keys["a2"], "outpatient")
        assert (again.status_code, again.json()["id"]) == (202, job_id), again.text
        by_rules = c.post("/v1/studies", files=files, headers=auth(keys["a1"]))
        assert (by_rules.status_code, by_rules.json()["id"]) == (202, job_id), by_rules.text

        # another study is refused as before, and leaves nothing behind: one of the same
        # accession number (read, hashed, no job has it), one of another (not read further)
        for name, extra in (("other", None), ("new-order", {"AccessionNumber": "NEW1"})):
            other = _submit(
                c, upload(make_study(root / name, extra=extra)), keys["a1"], "outpatient"
            )
            assert other.status_code == 503 and other.json()["error"]["code"] == "queue_full"
        # another site's key may not see the job: refused too (no job of its own)
        site_b = _submit(c, files, keys["b"], "outpatient")
        assert site_b.status_code == 503, site_b.text
        assert job_id not in site_b.text
        assert _study_folders(service) == stored
        assert not any((service.settings.data_dir / STAGING_DIR).glob("*"))
        assert [j.id for j in service.store.list_jobs(limit=20).items] == [job_id]
        actions = Counter(r.action for r in service.store.iter_audit() if r.subject == job_id)
        assert actions["job.joined"] == 2 and actions["job.submitted"] == 1
    finally:
        service.scheduler.release()
    assert wait_job(c, job_id, keys["a1"], timeout=300 * WAIT_SCALE)["state"] == "succeeded"

    # the queue full again (another study waits): the study is answered from its result
    service.scheduler.hold("test", "the other study stays waiting")
    try:
        filler = _submit(c, upload(make_study(root / "filler")), keys["a1"], "outpatient")
        assert filler.status_code == 202, filler.text
        cached = _submit(c, files, keys["a2"], "outpatient")
        assert cached.status_code == 200, cached.text
        assert cached.json()["cached_from"] == job_id
    finally:
        service.scheduler.release()


def test_a_study_whose_job_finishes_between_the_cache_and_the_insert_is_not_run_again(
    server: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result cache's look-up and the locked join are two reads: before, a job that
    succeeded between them was neither a cache hit nor unfinished, so the study got a
    second job that ran it again. Now the lock finds the result recorded since and the
    submission goes back to the cache."""
    service, c, keys = server["service"], server["client"], server["keys"]
    files = upload(make_study(server["root"] / "study"))
    service.scheduler.hold("test", "the first job waits until the second submission looks")
    first = _submit(c, files, keys["a1"], "outpatient")
    assert first.status_code == 202, first.text
    job_id = first.json()["id"]

    intake = service.intake
    looked = intake._cached_result
    late: list[bool] = []

    def finish_after_look(key: Any, origin: Any) -> Any:
        hit = looked(key, origin)
        if hit is None and not late:  # the job finishes right after this miss
            late.append(True)
            service.scheduler.release()
            until(
                lambda: service.store.get_job(job_id).state is JobState.SUCCEEDED,
                "the first job to succeed",
                300,
            )
        return hit

    monkeypatch.setattr(intake, "_cached_result", finish_after_look)
    second = _submit(c, files, keys["a2"], "outpatient")
    assert late == [True]
    assert second.status_code == 200, second.text
    assert second.json()["cached_from"] == job_id
    jobs = service.store.list_jobs(limit=20).items
    assert sorted(j.id for j in jobs) == sorted([job_id, second.json()["id"]])
    actions = Counter(r.action for r in service.store.iter_audit() if r.action.startswith("job."))
    assert actions["job.submitted"] == 1 and actions["job.cached"] == 1


def test_a_pacs_resending_a_waiting_study_joins_its_job_under_the_lock(
    server: dict[str, Any],
) -> None:
    """The gateways' unchanged re-send (``reuse``) answered an unfinished job from an
    unlocked read of its own: no ``job.joined`` record, no raise, whatever the join rule
    said. Now only a succeeded job answers there; an unfinished one through the lock."""
    service = server["service"]
    paths = make_study(server["root"] / "pacs")

    def send() -> Any:
        stored = service.intake.storage.store_study_files(paths)
        return service.intake.submit_stored(
            stored.path,
            stored.fingerprint,
            resolved=service.intake.catalog.resolve(None),
            priority=None,
            origin=Origin(client="PACS", source="dicom"),
            reuse=True,
        )

    service.scheduler.hold("test", "the first job stays waiting")
    try:
        first = send()
        assert not (first.joined or first.cached)
        again = send()
        assert again.job.id == first.job.id
        assert again.joined and not again.cached
        records = [r for r in service.store.iter_audit() if r.subject == first.job.id]
        [joined] = [r for r in records if r.action == "job.joined"]
        assert joined.payload["priority_class_asked"] == first.job.priority_class.value
    finally:
        service.scheduler.release()
    done = until(
        lambda: (job := service.store.get_job(first.job.id)).terminal and job,
        "the job to finish",
        300,
    )
    assert done.state is JobState.SUCCEEDED
    # succeeded: the re-send is answered by it as before (no new job, nothing sent again)
    resent = send()
    assert (resent.job.id, resent.reused, resent.cached) == (first.job.id, True, True)
