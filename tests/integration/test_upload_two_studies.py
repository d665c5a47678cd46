"""The upload form (``POST /v1/studies``): two zips of two studies are refused before a
job exists (422 ``several_studies``, the job's own words), and a zip some of whose
members are damaged runs with a report warning that counts them.

Session 41 trial "t-ingest": two zips of different studies in one form were answered
202 and their job failed ``several_studies`` (the README says a study the pipeline cannot
use is answered 422 with no job); a zip whose last members were zero-filled ran on the
slices left, its report without a word."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.service import auth, live_server, make_study, settings_for, wait_job

from radserve.errors import StudyError
from radserve.ingest.discover import SeveralStudiesError
from radserve.pipeline.inputs import ingest_study


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("two-studies")
    with live_server(settings_for(root), roles=("submit", "read")) as live:
        yield live


def _zipped(files: list[Path], path: Path, zeroed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for k, f in enumerate(files):
            data = f.read_bytes()
            archive.writestr(f.name, bytes(len(data)) if k >= len(files) - zeroed else data)
    return path


def _jobs(server: dict[str, Any]) -> int:
    return len(server["service"].store.list_jobs(limit=1000).items)


def test_two_zips_of_two_studies_are_refused_before_a_job_exists(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    a = _zipped(make_study(tmp_path / "a"), tmp_path / "up" / "a.zip")
    b = _zipped(make_study(tmp_path / "b"), tmp_path / "up" / "b.zip")
    jobs = _jobs(server)
    files = [("files", (p.name, p.read_bytes(), "application/zip")) for p in (a, b)]
    r = c.post("/v1/studies", files=files, headers=auth(key))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == SeveralStudiesError.code
    with pytest.raises(StudyError) as job:  # the words its job would have failed with
        service = server["service"]
        ingest_study(tmp_path / "up", pipeline=service.catalog.resolve(None).spec)
    assert (error["code"], error["message"]) == (job.value.code, job.value.message)
    assert _jobs(server) == jobs
    r = c.post("/v1/studies", files=files[:1], headers=auth(key))  # one of them: accepted
    assert r.status_code == 202, r.text


def test_a_zip_with_zero_filled_members_runs_with_a_warning_counting_them(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    study = _zipped(make_study(tmp_path / "s"), tmp_path / "study.zip", zeroed=2)
    files = [("files", (study.name, study.read_bytes(), "application/zip"))]
    r = c.post("/v1/studies", files=files, headers=auth(key))
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"], key)
    assert job["state"] == "succeeded", job
    report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(server["read"])).json()
    said = [w["message"] for w in report["warnings"]]
    assert any(m.startswith("2 file(s) of the input were skipped, unreadable") for m in said), said
    assert not any("study.zip" in m for m in said)
