"""A study re-sent unchanged over the same route is answered by the job that already
answers it (``reuse``: nothing is run or sent twice) only when the sender may see that
job under ``security.visibility``.

Found on 2026-12-07: the re-send look-up (``Store.find_answered``) ignored the visibility
rule. Site S filed a study over STOW-RS for the quiet period; when site N filed the same
study the same way, N's study got no job at all: it was "answered" by S's job, which N
cannot read (404), so N's study was never analysed for N. Now N gets its own job (run
again: the result cache also answers only from jobs N may see), and a key of S's own
site is still answered by S's job."""

from __future__ import annotations

from pathlib import Path

import httpx
from tests.factories.dicomweb import dicom_parts, related
from tests.factories.service import ServerThread, auth, make_study, settings_for, wait_job
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.service import Service
from radserve.store import JobRecord


def _quiet_stow(c: httpx.Client, files: list[Path], token: str) -> None:
    body, content_type = related(dicom_parts(files))
    sent = c.post(
        "/dicomweb/studies?complete=false",
        content=body,
        headers={"Content-Type": content_type, **auth(token)},
    )
    assert sent.status_code == 200, sent.text


def _handed_over(service: Service) -> None:
    tracker = service.stow.stow.tracker
    until(lambda: not tracker.pending(), "the quiet period's hand-over", 60)
    # a study leaves pending() as its hand-over starts; a poll waits for the one under
    # way (the tracker's poll lock) and so for intake's answer to it
    tracker.poll()


def _jobs(service: Service) -> list[JobRecord]:
    return list(service.store.list_jobs(limit=50).items)


def test_a_study_re_sent_by_another_site_is_that_site_s_own_job(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path, security__visibility="site", dicomweb__quiet_s=0.5))
    tokens: dict[str, str] = {}
    ids: dict[str, str] = {}
    for name, site in (("s", "S"), ("s2", "S"), ("n", "N")):
        record, tokens[name] = service.store.create_api_key(name=name, role="submit", site=site)
        ids[name] = record.id
    files = make_study(tmp_path / "study")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        _quiet_stow(c, files, tokens["s"])
        [first] = until(lambda: _jobs(service), "site S's job", 60)
        assert first.api_key_id == ids["s"]
        assert wait_job(c, first.id, tokens["s"])["state"] == "succeeded"

        # another key of the same site: answered by S's job, no new job (nothing twice)
        _quiet_stow(c, files, tokens["s2"])
        _handed_over(service)
        assert [job.id for job in _jobs(service)] == [first.id]

        # site N: a job of its own, which it can read; S's job stays invisible to it
        _quiet_stow(c, files, tokens["n"])
        _handed_over(service)
        ours = [job for job in _jobs(service) if job.id != first.id]
        assert [job.api_key_id for job in ours] == [ids["n"]], "N's study got no job of its own"
        assert wait_job(c, ours[0].id, tokens["n"])["state"] == "succeeded"
        assert ours[0].cached_from is None  # S's result is not N's to reuse either
        assert c.get(f"/v1/jobs/{first.id}", headers=auth(tokens["n"])).status_code == 404
