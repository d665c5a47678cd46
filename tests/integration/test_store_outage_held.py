"""A database outage longer than the job writes' wait (``jobs.store_outage_wait_s``),
on a real PostgreSQL server that the test stops and starts (radserve is not restarted):

- a job that has run waits at its first step that needs the database (the result
  lineage) for as long as the outage lasts, without using up its retries, instead of
  failing with ``store_error`` after two;
- a state change whose write the outage outlasts (here a cancel) is held, and written
  in order when the database answers; before, the job stayed ``queued`` in the store
  for good while its server kept renewing the lease, until a restart;
- afterwards the finished job is recorded once (one ``job.succeeded``, never
  requeued) and the server takes new work;
- each write that waits for the database logs two lines, when it starts waiting and
  when it ends (answered, or given up and held), with its tries (before session 17: one
  line per retry).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from tests.factories.private_postgres import PrivatePostgres
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.scheduling import JobState
from radserve.service import Service
from radserve.store.db import normalise_url

WAIT_S = 180.0


def _actions(url: str, job_id: str) -> list[str]:
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text("SELECT action FROM audit_records WHERE subject = :id ORDER BY seq"),
                {"id": job_id},
            )
            return [row[0] for row in rows]
    finally:
        engine.dispose()


def test_jobs_wait_out_a_long_database_outage_and_held_writes_land_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="radserve")
    with PrivatePostgres() as pg:
        settings = settings_for(
            tmp_path,
            database_url=pg.url,
            jobs__store_outage_wait_s=1.0,
            jobs__retry_backoff_s=1.0,
            scheduler__max_running=1,  # the second job waits while the first runs
        )
        service = Service(settings)
        key = create_key(service.store, "admin")
        # each try of the result lineage step (the first step after inference that needs
        # the database), counted: the job must outlast more tries than its retries allow
        lineage, tries = service.intake.lineage, []
        assert lineage is not None

        def counted(job_id: str, result: Any) -> Any:
            tries.append(job_id)
            return lineage(job_id, result)

        service.intake.lineage = counted
        with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
            assert service.wait_warm(120 * WAIT_SCALE)
            # the first job is held in inference until the database is down (a gate, not
            # a slow model: it is mid-flight at the outage however fast the machine is)
            session = service.catalog.sessions.get(
                service.catalog.registry.get("organs-test"), "fp32"
            )
            run, in_inference, outage = session.run, threading.Event(), threading.Event()

            def gated(batch: Any) -> Any:
                in_inference.set()
                outage.wait(WAIT_S * WAIT_SCALE)
                return run(batch)

            session.run = gated  # type: ignore[method-assign]
            try:
                ids = []
                for name in ("a", "b"):
                    answer = c.post(
                        "/v1/studies", files=upload(make_study(tmp_path / name)), headers=auth(key)
                    )
                    assert answer.status_code == 202, answer.text
                    ids.append(answer.json()["id"])
                first, second = ids
                until(in_inference.is_set, "the first job to reach inference", WAIT_S)

                pg.shut_down()
            finally:
                outage.set()
            info = service.scheduler.job_info(first)
            assert info is not None and info.state is JobState.RUNNING, info
            # the waiting job is cancelled during the outage: its write is held
            service.jobs.cancel(second, key_id=None, client=None)
            deferred = service.hooks.deferred
            until(
                lambda: deferred.held().get(second) == ["cancelled"],
                "the cancel's write to be held",
                WAIT_S,
            )
            # the first job waits at its lineage step: tried more often than a failing
            # job would be (once and max_retries more), its retries untouched
            enough = settings.jobs.max_retries + 2
            until(
                lambda: tries.count(first) >= enough,
                f"{enough} tries of the first job's lineage step",
                WAIT_S,
                state=lambda: (tries, service.scheduler.job_info(first)),
            )
            info = service.scheduler.job_info(first)
            assert info is not None and info.state is JobState.RUNNING, info
            assert info.retries == 0, info
            assert deferred.held().get(second) == ["cancelled"], "a held write was dropped"

            pg.start_again()
            until(lambda: not deferred.active, "the held writes to be made", WAIT_S)
            assert wait_job(c, first, key, timeout=WAIT_S)["state"] == "succeeded"
            assert service.store.get_job(second).state is JobState.CANCELLED
            assert Path(service.store.get_job(first).result_path or "", "report.json").is_file()
            actions = _actions(pg.url, first)
            assert actions.count("job.succeeded") == 1, actions
            assert "job.requeued" not in actions, actions
            assert "job.cancelled" in _actions(pg.url, second)

            # and the server takes new work as before
            study = make_study(tmp_path / "c")
            again = c.post("/v1/studies", files=upload(study), headers=auth(key))
            assert again.status_code == 202, again.text
            assert wait_job(c, again.json()["id"], key, timeout=WAIT_S)["state"] == "succeeded"
        service.stop()

    # every write that waited: one line when it began, one when it ended, with its tries
    said = [r.getMessage() for r in caplog.records if r.name == "radserve.store.waiting"]
    writes = [m for m in said if m.startswith("job ")]
    began = Counter(m.split(": the database")[0] for m in writes if "does not answer" in m)
    ended = Counter(
        m.split(": the database")[0]
        for m in writes
        if "answered after" in m or "did not answer for" in m
    )
    assert began, said  # the outage met at least one job's write
    assert set(began.values()) == {1} and ended == began, said
    assert len(writes) == 2 * len(began), writes
    assert all(" tries)" in m for m in writes if "does not answer" not in m), writes
    assert not any("retrying in" in r.getMessage() for r in caplog.records)
