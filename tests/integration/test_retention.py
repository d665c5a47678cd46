"""Retention (``storage.*_retention_days``, radserve.service.retention) on real files and
the real store, SQLite and PostgreSQL: a study's stored copy goes once every job of it has
been final for the retention, never while a job of it is unfinished or was final too
recently; the gateway's received copy goes once handed over and quiet; results go only
when asked for and none of their deliveries waits; a second pass removes nothing more;
two replicas' passes remove each folder once; a folder touched while it is being removed
is put back. Before, nothing was ever removed: every study stayed twice, for good, until
the gateway's free-space floor refused every C-STORE.

The clock of the sweep is moved forward instead of ageing rows: folders and rows are as
new as the test made them, and a pass "eight days later" sees them eight days old."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import update
from tests.factories.postgres import store_on
from tests.factories.retention import new_job as _job
from tests.factories.retention import stored_study as _study
from tests.factories.retention import succeed as _succeed
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)

import radserve.service.retention as retention_module
from radserve.api import create_app
from radserve.cli import cli
from radserve.config import ConfigError, StorageSettings, load_settings
from radserve.gateway.completeness import HANDOVER_MARKER, RECEIVING_PREFIX
from radserve.service import Service
from radserve.service.retention import AUDIT_ACTION, TRASH_DIR, Retention
from radserve.store import JobState, Store
from radserve.store.files import store_study_files
from radserve.store.models import CachedResult, Job, OutboxDelivery, ResultInstance
from radserve.store.outbox import NewDelivery, OutboxStore
from radserve.store.results import ResultIndex, ResultInstanceRecord

DAY = 86_400.0


def later(days: float) -> Any:
    return lambda: time.time() + days * DAY


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_retention") as opened:
        yield opened


def _fail(store: Store, job_id: str) -> None:
    store.transition(job_id, JobState.FAILED, error_code="study_invalid", error_message="x")


def _retention(data_dir: Path, store: Store, days: float = 8, **settings: Any) -> Retention:
    return Retention(data_dir, StorageSettings(**settings), store, clock=later(days))


def _audits(store: Store) -> list[dict[str, Any]]:
    return [dict(r.payload) for r in store.iter_audit() if r.action == AUDIT_ACTION]


def test_an_old_finished_study_goes_and_an_unfinished_ones_stays(
    store: Store, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    done = _study(data, tmp_path / "in-a", 1)
    failed = _study(data, tmp_path / "in-b", 2)
    waiting = _study(data, tmp_path / "in-c", 3)
    done_id = _job(store, done)
    _succeed(store, done_id, data / "results" / done_id, done)
    _fail(store, _job(store, failed))
    waiting_id = _job(store, waiting)
    store.transition(waiting_id, JobState.QUEUED)
    volume = data / "console" / "volumes" / f"{done_id}.nii.gz"  # the study view's copy
    volume.parent.mkdir(parents=True)
    volume.write_bytes(b"\1" * 1000)

    assert _retention(data, store, days=6).sweep().total == 0  # not old enough yet
    assert done.path.is_dir() and failed.path.is_dir()

    first = _retention(data, store).sweep()
    assert first.removed["sources"].folders == 2
    assert first.removed["sources"].bytes == done.total_bytes + failed.total_bytes + 1000
    assert first.console_volumes == 1 and not volume.exists()
    assert first.kept == {"unfinished_job": 1}
    assert not done.path.exists() and not failed.path.exists() and waiting.path.is_dir()
    # the job keeps its row and its result; nothing is left in the trash
    record = store.get_job(done_id)
    assert record.state is JobState.SUCCEEDED and Path(str(record.result_path)).is_dir()
    assert not any((data / TRASH_DIR).iterdir())

    second = _retention(data, store).sweep()  # idempotent: nothing more goes
    assert second.total == 0 and second.kept == {"unfinished_job": 1}
    audits = _audits(store)
    assert len(audits) == 1  # a pass that removed nothing is not audited
    assert audits[0]["removed"]["sources"] == {
        "folders": 2,
        "bytes": first.removed["sources"].bytes,
    }
    text = json.dumps(audits)
    assert done.fingerprint not in text and str(data) not in text and done_id not in text

    # sent again, the same study is stored again (not "already present")
    again = store_study_files(data, sorted((tmp_path / "in-a").iterdir()))
    assert again.path == done.path and not again.existed and again.path.is_dir()


def test_what_a_pass_that_stopped_half_way_left_in_the_trash_goes(
    store: Store, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    left = data / TRASH_DIR / f"{int(time.time() - 2 * 3600)}-0a0b0c0d-sources"
    deciding = data / TRASH_DIR / f"{int(time.time())}-0e0f0a0b-sources"  # another replica's
    for folder in (left, deciding):
        folder.mkdir(parents=True)
        (folder / "x.dcm").write_bytes(b"x")
    _retention(data, store).sweep(dry_run=True)
    assert left.is_dir()  # a dry run removes nothing
    _retention(data, store).sweep()
    assert not left.exists() and deciding.is_dir()


def test_a_study_stored_again_or_finished_lately_stays(store: Store, tmp_path: Path) -> None:
    data = tmp_path / "data"
    study = _study(data, tmp_path / "in", 1)
    _fail(store, _job(store, study))
    os.utime(study.path, (time.time() + 7 * DAY,) * 2)  # sent again a day "before" the pass
    assert _retention(data, store).sweep().total == 0
    assert study.path.is_dir()

    other = _study(data, tmp_path / "in-2", 2)
    _fail(store, _job(store, other))
    late = _job(store, other)  # a second job of it, final "now": 8 days before the pass
    _fail(store, late)
    with store.engine.begin() as connection:  # ...the other one final only lately
        connection.execute(
            update(Job)
            .where(Job.id == late)
            .values(finished=dt.datetime.now(dt.UTC) + dt.timedelta(days=5))
        )
    done = _retention(data, store).sweep()
    assert done.total == 0 and done.kept["recent_job"] == 1 and other.path.is_dir()


def test_a_folder_no_job_names_is_left_to_the_unclaimed_sweep(store: Store, tmp_path: Path) -> None:
    data = tmp_path / "data"
    orphan = _study(data, tmp_path / "in", 1)
    done = _retention(data, store).sweep()
    assert done.total == 0 and done.kept == {"no_job": 1} and orphan.path.is_dir()


def test_a_study_touched_while_it_is_removed_is_put_back(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-send touches the folder after the pass looked at it and before its rename:
    the folder is put back, and the re-send's job reads it."""
    data = tmp_path / "data"
    study = _study(data, tmp_path / "in", 1)
    _fail(store, _job(store, study))
    real = retention_module.jobs_of_studies

    def resent_meanwhile(*args: Any) -> Any:
        os.utime(study.path)  # radserve.store.files._move_into_place on a re-send
        return real(*args)

    monkeypatch.setattr(retention_module, "jobs_of_studies", resent_meanwhile)
    done = _retention(data, store).sweep()
    assert done.total == 0 and done.kept == {"changed": 1}
    assert study.path.is_dir() and len(list(study.path.iterdir())) == 3


def test_two_replicas_remove_each_folder_once(store: Store, tmp_path: Path) -> None:
    data = tmp_path / "data"
    studies = [_study(data, tmp_path / f"in-{i}", i) for i in range(12)]
    for study in studies:
        _fail(store, _job(store, study))
    passes: list[Any] = []
    replicas = [_retention(data, store) for _ in range(2)]
    threads = [threading.Thread(target=lambda r=r: passes.append(r.sweep())) for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(p.removed["sources"].folders for p in passes) == 12
    assert not any(s.path.exists() for s in studies)


def test_a_pass_is_bounded_and_the_next_goes_on(store: Store, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for i in range(5):
        _fail(store, _job(store, _study(data, tmp_path / f"in-{i}", i)))
    sweeper = _retention(data, store, retention_max_per_pass=2)
    removed = [sweeper.sweep() for _ in range(3)]
    assert [p.removed["sources"].folders for p in removed] == [2, 2, 1]
    assert removed[0].more and not removed[2].more


def _received(root: Path, uid: str, instances: int, handed: int | None) -> Path:
    folder = root / uid
    folder.mkdir(parents=True)
    for i in range(instances):
        (folder / f"{uid}.{i}.dcm").write_bytes(b"\2" * 2048)
    if handed is not None:
        (folder / HANDOVER_MARKER).write_text(json.dumps({"generation": 1, "instances": handed}))
    return folder


def test_the_received_copy_goes_once_handed_over_and_quiet(store: Store, tmp_path: Path) -> None:
    data = tmp_path / "data"
    incoming = data / "gateway" / "incoming"
    handed = _received(incoming, "1.2.3.1", 3, 3)
    late = _received(incoming, "1.2.3.2", 4, 3)  # a late instance not handed over yet
    never = _received(incoming, "1.2.3.3", 2, None)  # never handed over (intake refused)
    receiving = _received(incoming, "1.2.3.4", 2, 2)
    (receiving / f"{RECEIVING_PREFIX}{os.getpid()}-x").touch()  # an association is open
    quarantined = _received(data / "gateway" / "quarantine", "1.2.3.1", 1, None)
    stowed = _received(data / "dicomweb" / "incoming", "1.2.3.9", 2, 2)

    assert _retention(data, store, days=6).sweep().total == 0  # within the 7 days
    done = _retention(data, store).sweep()
    assert done.removed["incoming"].folders == 3
    assert done.removed["incoming"].bytes == (3 + 1 + 2) * 2048 + 2 * len(
        json.dumps({"generation": 1, "instances": 3})
    )
    assert not handed.exists() and not quarantined.exists() and not stowed.exists()
    assert late.is_dir() and never.is_dir() and receiving.is_dir()
    assert done.kept == {"not_handed_over": 2, "receiving": 1}
    assert _retention(data, store).sweep().total == 0
    # null keeps them: a site that wants every late instance to join its study for good
    kept = _retention(data, store, days=800, incoming_retention_days=None)
    assert kept.sweep().total == 0 and late.is_dir()


def test_a_late_instance_while_the_copy_is_removed_keeps_it(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An instance written into the folder between the look and the rename (the folder's
    own time changes): everything is put back, the new instance with it."""
    data = tmp_path / "data"
    folder = _received(data / "gateway" / "incoming", "1.2.3.1", 3, 3)
    real = retention_module._scan

    def late_instance(path: Path) -> Any:
        scanned = real(path)
        (path / "1.2.3.1.late.dcm").write_bytes(b"\3" * 100)
        return scanned

    monkeypatch.setattr(retention_module, "_scan", late_instance)
    done = _retention(data, store).sweep()
    assert done.total == 0 and done.kept == {"changed": 1}
    assert len(list(folder.glob("*.dcm"))) == 4


def test_results_go_only_when_asked_and_never_while_a_delivery_waits(
    store: Store, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    study = _study(data, tmp_path / "in", 1)
    job_id = _job(store, study)
    result = data / "results" / job_id
    _succeed(store, job_id, result, study)
    outbox = OutboxStore(store.engine, instance="test")
    outbox.add(
        [NewDelivery("PACS", str(result / "sr.dcm"), "1.2", "9.9", "1.2.3", "1.2.840.10008.1.2.1",
                     job_id=job_id)],
        now=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    ResultIndex(store.engine).add(
        [ResultInstanceRecord("9.9", "1.2.3", "9.8", "1.2", "1.2.840.10008.1.2.1", job_id,
                              str(result / "sr.dcm"))],
        now=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    first = _retention(data, store, days=400).sweep()  # results are kept by default
    assert first.removed["results"].folders == 0 and first.removed["sources"].folders == 1
    assert result.is_dir()

    assert _retention(data, store, days=31, result_retention_days=30).sweep().kept == {
        "unsent_delivery": 1
    }
    assert result.is_dir()
    with store.engine.begin() as connection:
        connection.execute(update(OutboxDelivery).values(state="sent"))
    # a study answered from the result later keeps it until that answer is old too
    copy = _job(store, study, cached_from=job_id)
    assert store.get_job(copy).result_path == str(result)
    with store.engine.begin() as connection:
        connection.execute(
            update(Job)
            .where(Job.id == copy)
            .values(finished=dt.datetime.now(dt.UTC) + dt.timedelta(days=20))
        )
    assert _retention(data, store, days=31, result_retention_days=30).sweep().kept == {
        "recent_job": 1
    }
    done = _retention(data, store, days=51, result_retention_days=30).sweep()
    assert done.removed["results"].folders == 1 and not result.exists()
    assert not study.path.exists()  # its source went at the first pass (7 days by default)
    with store.engine.connect() as connection:
        assert connection.execute(CachedResult.__table__.select()).first() is None
        assert connection.execute(ResultInstance.__table__.select()).first() is None
        assert connection.execute(OutboxDelivery.__table__.select()).first() is not None
    assert store.get_job(job_id).state is JobState.SUCCEEDED  # its row stays
    assert _retention(data, store, days=51, result_retention_days=30).sweep().total == 0


def test_the_settings_refuse_what_is_ambiguous_or_a_typo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = load_settings(None, data_dir=str(tmp_path)).storage
    assert (defaults.source_retention_days, defaults.incoming_retention_days) == (7.0, 7.0)
    assert defaults.result_retention_days is None
    for bad in (0, -1, 400, True, "soon"):
        with pytest.raises(ConfigError, match=r"storage\.source_retention_days"):
            load_settings(None, data_dir=str(tmp_path), storage__source_retention_days=bad)
    with pytest.raises(ConfigError, match="retention_max_per_pass"):
        load_settings(None, data_dir=str(tmp_path), storage__retention_max_per_pass=0)
    config = tmp_path / "radserve.yaml"
    config.write_text("storage: {source_retention_days: null, result_retention_days: 366}\n")
    storage = load_settings(config, data_dir=str(tmp_path)).storage
    assert storage.source_retention_days is None and storage.result_retention_days == 366
    monkeypatch.setenv("RADSERVE_STORAGE__INCOMING_RETENTION_DAYS", "null")
    assert load_settings(None, data_dir=str(tmp_path)).storage.incoming_retention_days is None


def test_all_null_starts_no_thread_and_removes_nothing(tmp_path: Path) -> None:
    with store_on("sqlite", tmp_path, "unused") as store:
        data = tmp_path / "data"
        _fail(store, _job(store, study := _study(data, tmp_path / "in", 1)))
        off = StorageSettings(source_retention_days=None, incoming_retention_days=None)
        sweeper = Retention(data, off, store, clock=later(800))
        sweeper.start()
        assert sweeper._thread is None and not sweeper.enabled
        assert sweeper.sweep().total == 0 and study.path.is_dir()
        sweeper.stop()


def test_the_thread_sweeps_at_start_and_stops(tmp_path: Path) -> None:
    with store_on("sqlite", tmp_path, "unused") as store:
        data = tmp_path / "data"
        _fail(store, _job(store, study := _study(data, tmp_path / "in", 1)))
        sweeper = _retention(data, store)
        sweeper.start()
        try:
            deadline = time.monotonic() + 30
            while sweeper.passes < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not study.path.exists() and sweeper.passes >= 1
        finally:
            sweeper.stop()
        assert sweeper._thread is not None and not sweeper._thread.is_alive()


def test_a_real_server_s_study_goes_and_its_job_and_report_stay(tmp_path: Path) -> None:
    """Through the API: the source of a finished job is removed, the job, its report and
    the metrics say so, and the same study sent again is stored again and answered."""
    service = Service(settings_for(tmp_path))
    key = create_key(service.store, "submit")
    files = upload(make_study(tmp_path / "a"))
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        job_id = c.post("/v1/studies", files=files, headers=auth(key)).json()["id"]
        assert wait_job(c, job_id, key)["state"] == "succeeded"
        study = Path(service.store.get_job(job_id).study_path)
        assert study.is_dir()
        # as the service wires it (its metrics registry), eight days later
        sweeper = Retention(
            service.settings.data_dir, service.settings.storage, service.store, clock=later(8)
        )
        service.metrics.registry.register(sweeper.collector)
        done = sweeper.sweep()
        assert done.removed["sources"].folders == 1 and not study.exists()
        metrics = c.get("/metrics").text
        assert 'radserve_retention_removed_folders_total{kind="sources"} 1.0' in metrics
        removed = float(done.removed["sources"].bytes)
        assert f'radserve_retention_removed_bytes_total{{kind="sources"}} {removed}' in metrics
        assert c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()["state"] == "succeeded"
        assert c.get(f"/v1/jobs/{job_id}/report", headers=auth(key)).status_code == 200
        # the FHIR Patient is read from the source: gone, not a Patient without name or
        # identifier (a FHIR server could file it as an anonymous patient)
        fhir = c.get(f"/v1/jobs/{job_id}/fhir", headers=auth(key))
        assert fhir.status_code == 410, fhir.text
        assert fhir.json()["error"]["code"] == "source_removed"
        again = c.post("/v1/studies", files=files, headers=auth(key))
        assert again.status_code in (200, 202), again.text
        assert study.is_dir()  # stored again
        answered = wait_job(c, again.json()["id"], key)
        assert answered["state"] == "succeeded"


def test_the_command_counts_sizes_only_and_removes_without_dry_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with store_on("sqlite", data, "unused") as store:
        study = _study(data, tmp_path / "in", 1)
        job_id = _job(store, study)
        _fail(store, job_id)
        with store.engine.begin() as connection:
            connection.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(finished=dt.datetime.now(dt.UTC) - dt.timedelta(days=9))
            )
    old = time.time() - 9 * DAY
    os.utime(study.path, (old, old))
    received = _received(data / "gateway" / "incoming", "1.2.3.1", 2, 2)
    for path in (*received.iterdir(), received):
        os.utime(path, (old, old))
    runner = CliRunner()
    dry = runner.invoke(cli, ["retention", "run", "--dry-run", "--data-dir", str(data)])
    assert dry.exit_code == 0, dry.output
    assert "sources   would remove 1 folder(s)" in dry.output
    assert "incoming  would remove 1 folder(s)" in dry.output
    assert "results   kept for good" in dry.output
    assert study.fingerprint not in dry.output and "1.2.3.1" not in dry.output
    assert study.path.is_dir() and received.is_dir()
    real = runner.invoke(cli, ["retention", "run", "--json", "--data-dir", str(data)])
    assert real.exit_code == 0, real.output
    payload = json.loads(real.output)
    assert payload["removed"]["sources"]["folders"] == 1
    assert payload["removed"]["incoming"]["folders"] == 1
    assert not study.path.exists() and not received.exists()
