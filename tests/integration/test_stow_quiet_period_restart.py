"""A study filed over STOW-RS for the quiet period (``?complete=false``) stays the job of
the key that sent it when the server restarts before the quiet period ends: the filer is
recorded in the study's folder, not only in memory.

Until 2026-12-07 the filer lived in memory only: after a restart the recovered study's
job had no key, so under ``security.visibility: site`` the site that sent it got 404 for
its own job and found nothing in ``GET /v1/jobs``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pydicom
import pytest
from tests.factories.dicomweb import dicom_parts, related
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
from radserve.service import Service
from radserve.service.dicomweb import Filer, read_filer

# the first server's quiet period outlasts the test: only the restart ends it
LONG_QUIET_S = 3600.0


def _keys(service: Service) -> dict[str, str]:
    """Key A (site N) and key B (site S), both of which may submit and read."""
    keys: dict[str, str] = {}
    for name, site in (("a", "N"), ("b", "S")):
        record, keys[name] = service.store.create_api_key(name=name, role="submit", site=site)
        keys[f"{name}_id"] = record.id
    return keys


def _stow(c: httpx.Client, files: list[Path], token: str, *, quiet: bool) -> httpx.Response:
    body, content_type = related(dicom_parts(files))
    return c.post(
        "/dicomweb/studies" + ("?complete=false" if quiet else ""),
        content=body,
        headers={"Content-Type": content_type, **auth(token)},
    )


def _listed(c: httpx.Client, token: str) -> list[str]:
    listed = c.get("/v1/jobs", headers=auth(token))
    assert listed.status_code == 200, listed.text
    return [str(j["id"]) for j in listed.json()["items"]]


def _file_for_the_quiet_period(
    c: httpx.Client, service: Service, files: list[Path], keys: dict[str, str]
) -> str:
    """Key A files ``files`` for the quiet period; returns the study's UID."""
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    sent = _stow(c, files, keys["a"], quiet=True)
    assert sent.status_code == 200, sent.text
    assert service.stow.stow.tracker.pending() == [study]
    return study


def _restarted(
    tmp_path: Path, study: str, keys: dict[str, str], first: Service, jobs: set[str]
) -> Service:
    """The server started again on ``first``'s data folder (a short quiet period,
    counted from the restart), once ``first`` stopped with ``study`` still waiting."""
    # stopped before the quiet period ended: no job was made for the study
    assert {j.id for j in first.store.list_jobs(limit=50).items} == jobs
    # what the study's folder keeps of its filer: the key's id, never its token
    folder = tmp_path / "data" / "dicomweb" / "incoming" / study
    assert not any(keys["a"].encode() in path.read_bytes() for path in folder.iterdir())
    return Service(settings_for(tmp_path, security__visibility="site", dicomweb__quiet_s=0.5))


def _new_job(service: Service, before: set[str]) -> Any:
    def made() -> list[Any]:
        return [j for j in service.store.list_jobs(limit=50).items if j.id not in before]

    [job] = until(made, "the recovered study's job after the quiet period", 60)
    return job


def test_a_study_filed_before_a_restart_is_the_sending_key_s_job_after_it(
    tmp_path: Path,
) -> None:
    first = Service(
        settings_for(tmp_path, security__visibility="site", dicomweb__quiet_s=LONG_QUIET_S)
    )
    keys = _keys(first)
    files = make_study(tmp_path / "study")[:4]
    with ServerThread(create_app(first)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        study = _file_for_the_quiet_period(c, first, files, keys)
    service = _restarted(tmp_path, study, keys, first, set())
    with (
        ServerThread(create_app(service)) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        job = _new_job(service, set())
        assert job.api_key_id == keys["a_id"]
        assert job.queue_meta.get("source") == "dicomweb"
        assert c.get(f"/v1/jobs/{job.id}", headers=auth(keys["a"])).status_code == 200
        assert _listed(c, keys["a"]) == [job.id]
        # the other site's key: as if the job did not exist
        assert c.get(f"/v1/jobs/{job.id}", headers=auth(keys["b"])).status_code == 404
        assert _listed(c, keys["b"]) == []


@pytest.mark.slow
def test_a_study_filed_before_a_restart_is_not_answered_from_another_site_s_result(
    tmp_path: Path,
) -> None:
    """The recovered filer keeps its visibility rule for the cache too: site S's result
    for the same study does not answer site N's job (it runs again), as before a
    restart. A filer restored with its key but without the rule would have been told,
    by an instant cached answer, that another site had analysed this patient's study."""
    first = Service(
        settings_for(tmp_path, security__visibility="site", dicomweb__quiet_s=LONG_QUIET_S)
    )
    keys = _keys(first)
    files = make_study(tmp_path / "study")
    with ServerThread(create_app(first)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert first.wait_warm(60 * WAIT_SCALE)
        # over the REST upload: a study re-sent over the same route (STOW-RS) is answered
        # by that route's earlier job before the cache is asked (Store.find_answered)
        ran = c.post("/v1/studies", files=upload(files), headers=auth(keys["b"]))
        assert ran.status_code == 202, ran.text
        b_job = str(ran.json()["id"])
        assert wait_job(c, b_job, keys["b"])["state"] == "succeeded"
        study = _file_for_the_quiet_period(c, first, files, keys)
    service = _restarted(tmp_path, study, keys, first, {b_job})
    with (
        ServerThread(create_app(service)) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        job = _new_job(service, {b_job})
        assert job.api_key_id == keys["a_id"]
        assert job.cached_from is None
        assert _listed(c, keys["a"]) == [job.id]
        assert _listed(c, keys["b"]) == [b_job]


def test_the_filer_is_on_disk_before_the_quiet_period_sees_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filer is recorded before the study's first instance of a request is tracked,
    so however short the quiet period, the study is never handed over without it. Until
    2026-12-07 it was written after the whole request had been filed: a quiet period
    shorter than the rest of the request made a job with no key, which its site could
    not see. Each real ``arrived`` is watched (it still runs) for the filer on disk."""
    service = Service(
        settings_for(tmp_path, security__visibility="site", dicomweb__quiet_s=LONG_QUIET_S)
    )
    keys = _keys(service)
    tracker = service.stow.stow.tracker
    arrived = tracker.arrived
    seen: list[Filer | None] = []

    def watched(study: str, folder: Path, *args: Any, **kwargs: Any) -> None:
        seen.append(read_filer(folder, quiet=True))
        arrived(study, folder, *args, **kwargs)

    monkeypatch.setattr(tracker, "arrived", watched)
    files = make_study(tmp_path / "study")[:4]
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        _file_for_the_quiet_period(c, service, files, keys)
    assert len(seen) >= len(files)
    assert {filer.key_id if filer else None for filer in seen} == {keys["a_id"]}
