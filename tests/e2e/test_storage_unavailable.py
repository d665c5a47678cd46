"""Issue 15: the shared data folder becomes unavailable under a real ``radserve serve``.

The data folder is a bind mount the test makes read-only (``mount -o remount,bind,ro``:
writes fail with EROFS, as on an NFS server gone read-only) and then writable again;
the database is a SQLite file outside it. Checked: ``/readyz`` turns 503 naming the
data folder once the storage probe sees it, an upload is refused with 503
``storage_unavailable`` (retryable) and leaves no job and no study behind (nothing
acknowledged that is not durable), and once the folder is writable again the server is
ready and a study succeeds. The switch-over times are printed, not asserted. Needs root
(mount); skips otherwise.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.factories.dicom_net import free_port
from tests.factories.fhir_server import FhirServer
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import (
    auth,
    config_file,
    make_models_slow,
    make_study,
    upload,
    wait_job,
)
from tests.factories.waits import until

SLOW_GRID = {"n_slices": 24, "rows": 96, "cols": 96, "spacing": (2.0, 1.5, 1.5)}


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/shared``: a bind mount of ``tmp_path/real``, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    real, mount = tmp_path / "real", tmp_path / "shared"
    real.mkdir()
    mount.mkdir()
    done = subprocess.run(["mount", "--bind", str(real), str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _remount(path: Path, mode: str, *, within_s: float = 30.0) -> None:
    """The kernel refuses a read-only remount with EBUSY while any file on the mount is
    open for writing (a job writing its result, the audit log appending): a folder that
    goes read-only under a server is exactly that moment, so try again until a gap."""
    deadline = time.monotonic() + within_s
    while True:
        done = subprocess.run(
            ["mount", "-o", f"remount,bind,{mode}", str(path)], capture_output=True
        )
        if done.returncode == 0:
            return
        reason = done.stderr.decode(errors="replace").strip()
        if "busy" not in reason or time.monotonic() > deadline:
            raise AssertionError(f"remount {mode} of {path} failed: {reason}")
        time.sleep(0.02)


@pytest.mark.slow
def test_an_unwritable_data_folder_makes_the_server_unready_and_refuses_uploads(
    tmp_path: Path, shared: Path
) -> None:
    config = config_file(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'local' / 'radserve.db'}",
        storage={"probe_interval_s": 0.5, "probe_timeout_s": 5.0},
    )
    key = create_key_cli(config, shared)
    port, log = free_port(), tmp_path / "serve.log"
    server = start_server(config, shared, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:

            def ready() -> int:
                return c.get("/readyz", headers=auth(key)).status_code

            def submit(name: str) -> httpx.Response:
                study = make_study(tmp_path / name)
                return c.post("/v1/studies", files=upload(study), headers=auth(key))

            def jobs() -> int:
                return len(c.get("/v1/jobs", headers=auth(key)).json()["items"])

            until(lambda: ready() == 200, "the server to be ready")
            r = submit("before")
            assert r.status_code == 202, r.text
            assert wait_job(c, r.json()["id"], key, timeout=120)["state"] == "succeeded"
            studies = sorted((shared / "studies").rglob("*"))

            _remount(shared, "ro")
            t0 = time.monotonic()
            until(lambda: ready() == 503, "/readyz to say not ready")
            down_s = time.monotonic() - t0
            body = c.get("/readyz", headers=auth(key)).json()
            assert not body["ready"]
            assert "the data folder cannot be written: EROFS" in body["reasons"]
            refused = submit("during")
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "storage_unavailable"
            assert refused.json()["error"]["retryable"] is True
            assert jobs() == 1  # nothing acknowledged, nothing half-made
            assert sorted((shared / "studies").rglob("*")) == studies

            _remount(shared, "rw")
            t0 = time.monotonic()
            until(lambda: ready() == 200, "/readyz to say ready again")
            up_s = time.monotonic() - t0
            r = submit("after")
            assert r.status_code == 202, r.text
            assert wait_job(c, r.json()["id"], key, timeout=120)["state"] == "succeeded"
            assert jobs() == 2
        print(f"\nstorage probe at 0.5 s: unready after {down_s:.2f} s, ready after {up_s:.2f} s")
    finally:
        _remount(shared, "rw")
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    text = log.read_text()
    assert "the data folder cannot be written (EROFS)" in text
    assert "writable again" in text


@pytest.mark.slow
def test_with_a_fallback_studies_and_results_go_local_and_move_back(
    tmp_path: Path, shared: Path
) -> None:
    """``storage.fallback_dir``: while the data folder is read-only an upload is still
    acknowledged (stored in the local fallback), a job running across the switch keeps
    its result locally, the server stays ready (degraded); when the folder is writable
    again everything moves back: every study, result, outbox and index path names the
    data folder, the fallback is empty, each job has one result and one Bundle."""
    fallback = tmp_path / "local-fallback"
    database = tmp_path / "local" / "radserve.db"
    with FhirServer() as fhir:
        config = config_file(
            tmp_path,
            database_url=f"sqlite:///{database}",
            storage={
                "probe_interval_s": 0.5,
                "probe_timeout_s": 5.0,
                "fallback_dir": str(fallback),
            },
            fhir={"url": fhir.url, "timeout_s": 30},
        )
        make_models_slow(tmp_path / "assets" / "models", layers=4, channels=32)
        key = create_key_cli(config, shared)
        port, log = free_port(), tmp_path / "serve.log"
        server = start_server(config, shared, port, log)

        def rows(query: str) -> list:
            with sqlite3.connect(database) as db:
                return db.execute(query).fetchall()

        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:

                def submit(name: str) -> str:
                    study = make_study(tmp_path / name, background=-100.0, **SLOW_GRID)
                    r = c.post("/v1/studies", files=upload(study), headers=auth(key))
                    assert r.status_code == 202, r.text
                    return str(r.json()["id"])

                def state(job_id: str) -> str:
                    return str(c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()["state"])

                until(lambda: c.get("/readyz", headers=auth(key)).status_code == 200, "ready")
                before = submit("before")
                assert wait_job(c, before, key, timeout=120)["state"] == "succeeded"
                across = submit("across")
                until(lambda: state(across) == "running", "a job to run")

                _remount(shared, "ro")
                t0 = time.monotonic()
                during = submit("during")
                accepted_s = time.monotonic() - t0
                (study_path,) = rows(f"SELECT study_path FROM jobs WHERE id = '{during}'")[0]
                assert Path(study_path).is_relative_to(fallback)
                ready = c.get("/readyz", headers=auth(key))
                assert ready.status_code == 200 and ready.json()["degraded"], ready.text
                assert any("local fallback" in r for r in ready.json()["reasons"])
                for job_id in (across, during):
                    assert wait_job(c, job_id, key, timeout=180)["state"] == "succeeded"
                    (result_path,) = rows(f"SELECT result_path FROM jobs WHERE id = '{job_id}'")[0]
                    assert Path(result_path).is_relative_to(fallback), result_path
                    report = c.get(f"/v1/jobs/{job_id}/report", headers=auth(key))
                    assert report.status_code == 200, report.text

                _remount(shared, "rw")
                t1 = time.monotonic()

                def fallback_empty() -> bool:
                    return not any(p.is_file() for p in fallback.rglob("*"))

                until(fallback_empty, "the fallback to move back", timeout=120)
                back_s = time.monotonic() - t1
                ids = [before, across, during]
                for job_id in ids:
                    report = c.get(f"/v1/jobs/{job_id}/report", headers=auth(key))
                    assert report.status_code == 200, report.text
                until(
                    lambda: (
                        rows("SELECT count(*) FROM outbox_deliveries WHERE state = 'sent'")[0][0]
                        == len(ids)
                    ),
                    "every Bundle to be sent",
                )
            paths = rows("SELECT study_path, result_path FROM jobs")
            paths += rows("SELECT path, NULL FROM outbox_deliveries")
            for study_path, result_path in paths:
                assert Path(study_path).is_relative_to(shared), study_path
                assert result_path is None or Path(result_path).is_relative_to(shared)
            for (result_path,) in rows("SELECT result_path FROM jobs"):
                assert (Path(result_path) / "report.json").is_file()
            succeeded = rows(
                "SELECT subject, count(*) FROM audit_records "
                "WHERE action = 'job.succeeded' GROUP BY subject"
            )
            assert dict(succeeded) == dict.fromkeys(ids, 1)
            assert len({r.json()["id"] for r in fhir.received}) == len(ids)
            print(
                f"\nfallback: upload acknowledged {accepted_s:.2f} s after the remount; "
                f"fallback emptied {back_s:.2f} s after the data folder came back"
            )
        finally:
            _remount(shared, "rw")
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    text = log.read_text()
    assert "stored in the local fallback" in text
    assert "moved back from the local fallback" in text
