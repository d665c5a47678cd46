"""Retention of the comparison runs' folders (``comparisons/<job id>/``: a canary's or
shadow's figures, ``<version>.json``, and the trial output of a run in progress or cut
off, ``<version>/``) on real files and the real store, SQLite and PostgreSQL. They go
under the results' rule (``storage.result_retention_days``, kept by default), once their
job has been final that long and nothing in them was written for as long; never while a
run writes into one. Counted as the kind ``comparisons`` in the pass, its audit record,
its metrics and the command's JSON. Before, nothing ever removed them: a site that set
``result_retention_days`` kept every trial's files for good."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import update
from tests.factories.postgres import store_on
from tests.factories.retention import (
    age,
    new_job,
    retention_audits,
    stored_study,
    succeed,
    sweeper,
)

import radserve.service.retention as retention_module
from radserve.cli import cli
from radserve.service.failover import COMPARISONS_DIR
from radserve.service.retention import TRASH_DIR
from radserve.store import JobState, Store
from radserve.store.models import Job

RESULTS = {"result_retention_days": 30}


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_retention_cmp") as opened:
        yield opened


def _trial(data: Path, job_id: str, *, figures: bool = True, left: bool = False) -> Path:
    """``comparisons/<job id>/`` as the lifecycle leaves it: a comparison's figures, and
    (``left``) the trial output of a run that failed or was cut off."""
    folder = data / COMPARISONS_DIR / job_id
    folder.mkdir(parents=True)
    if figures:
        (folder / "2.0.json").write_text(json.dumps({"step": "organs", "mean_dice": 0.9}))
    if left:
        (folder / "3.0").mkdir()
        (folder / "3.0" / "labels.nii.gz").write_bytes(b"\1" * 20_000)
        (folder / "3.0" / "report.json").write_text("{}")
    return folder


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _finished_job(store: Store, data: Path, tmp_path: Path, seed: int) -> str:
    study = stored_study(data, tmp_path / f"in-{seed}", seed)
    job_id = new_job(store, study)
    succeed(store, job_id, data / "results" / job_id, study)
    return job_id


def test_comparison_folders_go_under_the_result_rule_and_are_counted_like_the_others(
    store: Store, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    job_id = _finished_job(store, data, tmp_path, 1)
    trial = _trial(data, job_id, left=True)
    size = _size(trial)

    # kept by default, like results (result_retention_days: null)
    kept = sweeper(data, store, days=400).sweep()
    assert kept.removed["comparisons"].folders == 0 and trial.is_dir()
    # the job final for less than the retention: kept
    assert sweeper(data, store, days=20, **RESULTS).sweep().removed["comparisons"].folders == 0
    assert trial.is_dir()

    dry = sweeper(data, store, days=31, **RESULTS).sweep(dry_run=True)
    assert (dry.removed["comparisons"].folders, dry.removed["comparisons"].bytes) == (1, size)
    assert "would remove" in dry.summary() and "1 comparisons folder(s)" in dry.summary()
    assert trial.is_dir()

    policy = sweeper(data, store, days=31, **RESULTS)
    done = policy.sweep()
    assert (done.removed["comparisons"].folders, done.removed["comparisons"].bytes) == (1, size)
    assert done.removed["results"].folders == 1  # its job's result went by the same rule
    assert not trial.exists() and (data / COMPARISONS_DIR).is_dir()
    assert not any((data / TRASH_DIR).iterdir())
    audit = retention_audits(store)[-1]
    assert audit["removed"]["comparisons"] == {"folders": 1, "bytes": size}
    assert job_id not in json.dumps(audit)  # counts and sizes, no identifier
    metrics = {
        (family.name, sample.labels.get("kind")): sample.value
        for family in policy.collector.collect()
        for sample in family.samples
    }
    assert metrics[("radserve_retention_removed_folders", "comparisons")] == 1
    assert metrics[("radserve_retention_removed_bytes", "comparisons")] == size

    again = sweeper(data, store, days=31, **RESULTS).sweep()  # idempotent
    assert again.total == 0 and not again.kept


def test_a_comparison_run_in_progress_keeps_its_folder(store: Store, tmp_path: Path) -> None:
    """A run writes its trial output into ``<version>/``: the folder's own time is as
    old as the run's start, the files in it are new. Kept until the run is as quiet as
    the retention; the figures of a finished comparison go."""
    data = tmp_path / "data"
    running = _trial(data, _finished_job(store, data, tmp_path, 1), left=True)
    age(running / "3.0" / "labels.nii.gz", 31 - 1 / 24)  # written an hour before the pass
    done_job = _finished_job(store, data, tmp_path, 2)
    finished = _trial(data, done_job)
    done = sweeper(data, store, days=31, **RESULTS).sweep()
    assert done.removed["comparisons"].folders == 1 and not finished.exists()
    assert done.kept == {"comparison_running": 1} and running.is_dir()
    assert (running / "3.0" / "labels.nii.gz").is_file()
    # once as quiet as the retention (a run that was cut off): it goes
    later = sweeper(data, store, days=62, **RESULTS).sweep()
    assert later.removed["comparisons"].folders == 1 and not running.exists()


def test_a_comparison_folder_stays_while_its_job_needs_it_or_no_job_names_it(
    store: Store, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    unfinished_study = stored_study(data, tmp_path / "in-1", 1)
    unfinished = new_job(store, unfinished_study)
    store.transition(unfinished, JobState.QUEUED)
    _trial(data, unfinished)
    recent = _finished_job(store, data, tmp_path, 2)
    _trial(data, recent)
    with store.engine.begin() as connection:  # final 20 days "before" the pass, not 31
        connection.execute(
            update(Job)
            .where(Job.id == recent)
            .values(finished=dt.datetime.now(dt.UTC) + dt.timedelta(days=11))
        )
    orphan = _trial(data, "0" * 32)  # no such job: not radserve's to judge
    done = sweeper(data, store, days=31, source_retention_days=None, **RESULTS).sweep()
    assert done.removed["comparisons"].folders == 0
    # recent_job: the comparison folder, and the job's result folder by the same rule
    assert done.kept == {"unfinished_job": 1, "recent_job": 2, "no_job": 1}
    assert orphan.is_dir() and len(list((data / COMPARISONS_DIR).iterdir())) == 3


def test_a_run_starting_while_its_folder_is_removed_puts_it_back(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A comparison run of the job starts between the look and the rename (it makes its
    trial folder: the folder's own time changes): the folder is put back, the new
    trial folder in it."""
    data = tmp_path / "data"
    folder = _trial(data, _finished_job(store, data, tmp_path, 1))
    real = retention_module._tree

    def run_starts(path: Path) -> Any:
        scanned = real(path)
        (path / "4.0").mkdir()  # radserve.service.lifecycle.run_comparison's out_dir
        return scanned

    monkeypatch.setattr(retention_module, "_tree", run_starts)
    done = sweeper(data, store, days=31, **RESULTS).sweep()
    assert done.removed["comparisons"].folders == 0 and done.kept == {"changed": 1}
    assert (folder / "2.0.json").is_file() and (folder / "4.0").is_dir()


def test_a_pass_is_bounded_for_comparisons_too(store: Store, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for seed in range(3):
        _trial(data, _finished_job(store, data, tmp_path, seed))
    policy = sweeper(data, store, days=31, retention_max_per_pass=2, **RESULTS)
    removed = [policy.sweep().removed["comparisons"].folders for _ in range(2)]
    assert removed == [2, 1] and not any((data / COMPARISONS_DIR).iterdir())


def test_the_command_counts_comparisons_in_its_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    with store_on("sqlite", data, "unused") as store:
        job_id = _finished_job(store, data, tmp_path, 1)
        with store.engine.begin() as connection:
            connection.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(finished=dt.datetime.now(dt.UTC) - dt.timedelta(days=40))
            )
    trial = _trial(data, job_id, left=True)
    for path in (*trial.rglob("*"), trial):
        age(path, -40)
    monkeypatch.setenv("RADSERVE_STORAGE__RESULT_RETENTION_DAYS", "30")
    runner = CliRunner()
    args = ["retention", "run", "--json", "--data-dir", str(data)]
    dry = runner.invoke(cli, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    # the last line: a first run of a command logs the audit key it created before it
    assert json.loads(dry.output.splitlines()[-1])["removed"]["comparisons"]["folders"] == 1
    assert trial.is_dir()
    real = runner.invoke(cli, args)
    assert real.exit_code == 0, real.output
    assert json.loads(real.output.splitlines()[-1])["removed"]["comparisons"] == {
        "folders": 1,
        "bytes": 20_000 + 2 + len(json.dumps({"step": "organs", "mean_dice": 0.9})),
    }
    assert not trial.exists()
