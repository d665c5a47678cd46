"""The records of installs run after their request (radserve.lifecycle.install_tasks):
read by any process, an unfinished one whose owner is gone reads as interrupted, the
newest kept."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tests.factories.writers import ended_and_running

from radserve import durable
from radserve.lifecycle import install_tasks
from radserve.lifecycle.install_tasks import InstallTasks


def test_a_record_goes_from_queued_to_its_end_and_is_read_back(tmp_path: Path) -> None:
    tasks = InstallTasks(tmp_path)
    task = tasks.create("bundle.zip", actor="key1", precisions=["int8"])
    assert tasks.get(task.id) == task and task.state == "queued"
    building = tasks.started(task)
    assert tasks.get(task.id) == building and building.started is not None
    done = tasks.installed(building, {"name": "m", "version": "1", "files": {}, "variants": {}})
    assert tasks.get(task.id) == done and done.state == "installed"
    assert "owner" not in done.as_json() and done.as_json()["result"]["name"] == "m"
    other = tasks.ended(tasks.create("b.zip", actor=None, precisions=None), "rejected", "x", "why")
    assert [t.id for t in tasks.recent()] == [other.id, task.id]
    assert tasks.get(other.id).error == {"code": "x", "message": "why"}


def test_an_unfinished_record_of_a_process_that_is_gone_reads_as_interrupted(
    tmp_path: Path,
) -> None:
    tasks = InstallTasks(tmp_path)
    with ended_and_running() as (ended, running):
        host = durable.process_tag().partition("-")[0]
        for owner, state, expected in (
            (f"{host}-{ended}", "building", "interrupted"),
            (f"{host}-{ended}", "queued", "interrupted"),
            (f"{host}-{running.pid}", "building", "building"),
            ("0123abcd-1", "building", "building"),  # another host's: cannot be asked
            (f"{host}-{ended}", "installed", "installed"),
        ):
            task = replace(tasks.create("b.zip", actor=None, precisions=None), owner=owner)
            path = tasks.folder / f"{task.id}.json"
            record = {**json.loads(path.read_text()), "owner": owner, "state": state}
            path.write_text(json.dumps(record))
            read = tasks.get(task.id)
            assert read is not None and read.state == expected, (owner, state)
            if expected == "interrupted":
                assert read.error is not None and "send the bundle again" in read.error["message"]


def test_ids_that_are_not_a_record_name_find_nothing(tmp_path: Path) -> None:
    tasks = InstallTasks(tmp_path)
    task = tasks.create("b.zip", actor=None, precisions=None)
    (tasks.folder / "settings.json").write_text("{}")
    (tasks.folder / f"{'f' * 32}.json").write_text("not json")  # being replaced, or foreign
    for unknown in ("../settings", "settings", task.id.upper(), "f" * 32, ""):
        assert tasks.get(unknown) is None
    assert [t.id for t in tasks.recent()] == [task.id]


def test_the_newest_records_are_kept_and_an_unfinished_one_always(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(install_tasks, "KEPT", 3)
    tasks = InstallTasks(tmp_path)
    oldest = tasks.create("0.zip", actor=None, precisions=None)  # queued, owner running
    made = [
        tasks.ended(tasks.create(f"{n}.zip", actor=None, precisions=None), "failed", "e", "x")
        for n in range(1, 7)
    ]
    kept = {t.id for t in tasks.recent(limit=100)}
    assert oldest.id in kept  # unfinished: never pruned
    assert {t.id for t in made[-3:]} <= kept and len(kept) == 4


def test_a_build_that_failed_after_its_install_is_recorded_as_installed(tmp_path: Path) -> None:
    """What follows the rename into the store (the catalog rescan, the audit record) may
    fail; the version is installed all the same, and its record must not say refused.
    Another install of the same version, or one of another source or key, is not ours."""
    from tests.factories.bundles import write_test_bundles
    from tests.factories.console import lesion_bundle

    from radserve.errors import BundleExistsError
    from radserve.lifecycle.install import finish_install, stage_bundle
    from radserve.lifecycle.install_tasks import InstallTasks
    from radserve.service.install_queue import _installed_before, _Order
    from radserve.service.variant_install import VariantRequest
    from radserve.store.errors import StoreError

    models = write_test_bundles(tmp_path / "models")
    data = tmp_path / "data"
    folder = lesion_bundle(models, "1.9.0", tmp_path / "b")
    staged = stage_bundle(folder, data, described_as="HTTP upload (1 bytes)")
    task = InstallTasks(data).create(staged.source_name, actor="k1", precisions=None)
    order = _Order(task, staged, "k1", None, VariantRequest())
    assert _installed_before(order, StoreError("the database is away")) is None  # not yet
    finish_install(staged, actor="k1")
    record = _installed_before(order, StoreError("the database is away"))
    assert record is not None and (record.name, record.version) == ("lesions-test", "1.9.0")
    assert _installed_before(order, BundleExistsError("raced")) is None
    other = _Order(task, staged, "k2", None, VariantRequest())
    assert _installed_before(other, StoreError("x")) is None
