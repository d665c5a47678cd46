"""A study sent over STOW-RS for the quiet period (``?complete=false``) becomes a job of
the key that sent it, as a complete study's job is: under ``security.visibility: site``
the sending site sees it, another site does not.

Before 2026-12-07 the quiet period's job was submitted by no key: only admins saw it, and
the site that sent the study found nothing in ``GET /v1/jobs``."""

from __future__ import annotations

from pathlib import Path

import httpx
from tests.factories.dicomweb import dicom_parts, related
from tests.factories.service import ServerThread, auth, make_study, settings_for
from tests.factories.waits import until

from radserve.api import create_app
from radserve.service import Service


def test_the_quiet_period_s_job_is_the_sending_key_s(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path, security__visibility="site", dicomweb__quiet_s=0.5))
    keys = {}
    for name, role, site in (
        ("submit_n", "submit", "N"),
        ("read_n", "read", "N"),
        ("read_s", "read", "S"),
    ):
        record, keys[name] = service.store.create_api_key(name=name, role=role, site=site)
        keys[name + "_id"] = record.id
    with (
        ServerThread(create_app(service)) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        body, content_type = related(dicom_parts(make_study(tmp_path / "study")[:4]))
        sent = c.post(
            "/dicomweb/studies?complete=false",
            content=body,
            headers={"Content-Type": content_type, **auth(keys["submit_n"])},
        )
        assert sent.status_code == 200, sent.text

        def jobs(key: str) -> list[dict[str, object]]:
            listed = c.get("/v1/jobs", headers=auth(keys[key]))
            assert listed.status_code == 200, listed.text
            return list(listed.json()["items"])

        until(lambda: service.store.list_jobs(limit=5).items, "the quiet period's job", 60)
        [job] = service.store.list_jobs(limit=5).items
        assert job.api_key_id == keys["submit_n_id"]
        assert [j["id"] for j in jobs("read_n")] == [job.id]
        assert jobs("read_s") == []
