"""The result folder of a voided run (``results/<job id>.<incarnation>``, or the
``results/<job id>`` of the run a take-over replaced) is deleted once the job's winning
result is recorded and nothing has written into it for the grace; the folder the job's
row names (the one served) is never touched, nor the folders of an unfinished job.
Before, every voided run left a study's worth of result files on disk for good.

The job is a real one (a study through the API); the voided runs' folders are copies of
its result folder, as a second run of the same job writes them."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import httpx
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
from radserve.service.voided_runs import GRACE_S, VoidedRunFolders


def _age(folder: Path, seconds: float) -> None:
    """Every entry of ``folder`` last written ``seconds`` ago."""
    then = time.time() - seconds
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.utime(os.path.join(parent, name), (then, then))
    os.utime(folder, (then, then))


def test_voided_runs_folders_go_once_the_result_is_settled_and_the_served_one_stays(
    tmp_path: Path,
) -> None:
    service = Service(settings_for(tmp_path))
    key = create_key(service.store, "submit")
    results = tmp_path / "data" / "results"
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        submitted = c.post(
            "/v1/studies", files=upload(make_study(tmp_path / "a")), headers=auth(key)
        )
        job_id = submitted.json()["id"]
        assert wait_job(c, job_id, key)["state"] == "succeeded"
        served = Path(service.store.get_job(job_id).result_path or "")
        assert served.is_dir() and served.parent == results
        report = c.get(f"/v1/jobs/{job_id}/report", headers=auth(key))
        assert report.status_code == 200

        old = results / f"{job_id}.{uuid.uuid4().hex[:8]}"  # a voided run, quiet since
        fresh = results / f"{job_id}.{uuid.uuid4().hex[:8]}"  # one that may still write
        for folder in (old, fresh):
            shutil.copytree(served, folder)
        _age(old, GRACE_S + 60)
        _age(served, GRACE_S + 60)  # the served one is as old: kept for being served
        # a job with no row (not radserve's, or its row not written yet): left alone
        stray = results / f"{uuid.uuid4()}.{uuid.uuid4().hex[:8]}"
        shutil.copytree(served, stray)
        _age(stray, GRACE_S + 60)

        sweeper = VoidedRunFolders(results, service.store)
        assert sweeper.sweep() == [old]
        assert not old.exists() and fresh.is_dir() and served.is_dir() and stray.is_dir()
        assert not any(p.name.startswith(".voided-") for p in results.iterdir())

        later = VoidedRunFolders(results, service.store, clock=lambda: time.time() + GRACE_S)
        assert later.sweep() == [fresh]
        assert served.is_dir() and stray.is_dir()
        assert later.sweep() == []
        again = c.get(f"/v1/jobs/{job_id}/report", headers=auth(key))
        assert again.status_code == 200 and again.content == report.content


def test_the_folders_of_an_unfinished_job_stay(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path))
    key = create_key(service.store, "submit")
    results = tmp_path / "data" / "results"
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        service.scheduler.hold("test", "the job stays unfinished")
        try:
            submitted = c.post(
                "/v1/studies", files=upload(make_study(tmp_path / "a")), headers=auth(key)
            )
            job_id = submitted.json()["id"]
            voided = results / f"{job_id}.{uuid.uuid4().hex[:8]}"
            (voided / "seg").mkdir(parents=True)
            (voided / "seg" / "part.dcm").write_bytes(b"a run's output")
            _age(voided, GRACE_S + 60)
            assert VoidedRunFolders(results, service.store).sweep() == []
            assert voided.is_dir()
        finally:
            service.scheduler.release()
        assert wait_job(c, job_id, key)["state"] == "succeeded"
        assert VoidedRunFolders(results, service.store).sweep() == [voided]
