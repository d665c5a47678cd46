"""The records of installs run after their request (radserve.lifecycle.install_tasks):
read by any process, kept with their bundle until they end; one left unfinished by a
stop or by a process that is gone waits for the next server, which claims it (one
server of two), and is given up after MAX_ATTEMPTS builds; the newest kept."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from tests.factories.writers import ended_and_running

from radserve import durable
from radserve.lifecycle import install_tasks
from radserve.lifecycle.install_tasks import MAX_ATTEMPTS, InstallTask, InstallTasks

_made = iter(range(10**6))


def new(tasks: InstallTasks, source: str = "b.zip", **fields: object) -> InstallTask:
    """A record made as the server makes one: with a checked bundle folder moved in."""
    bundle = tasks.folder.parent / f"staged-{next(_made)}"
    bundle.mkdir(parents=True)
    (bundle / "model.yaml").write_text("name: m\n")
    fields = {"actor": None, "precisions": None, **fields}
    return tasks.create(bundle, source, **fields)  # type: ignore[arg-type]


def rewrite(tasks: InstallTasks, task: InstallTask, **fields: object) -> None:
    """Edit a record on disk, as another process (or a crashed one) left it."""
    path = tasks.folder / f"{task.id}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_record_goes_from_queued_to_its_end_and_is_read_back(tmp_path: Path) -> None:
    tasks = InstallTasks(tmp_path)
    task = new(tasks, "bundle.zip", actor="key1", precisions=["int8"], client="10.0.0.9")
    assert tasks.get(task.id) == task and task.state == "queued"
    assert (tasks.bundle(task) / "model.yaml").is_file()  # kept with it until it ends
    building = tasks.started(task)
    assert tasks.get(task.id) == building and building.started is not None
    assert building.attempts == 1
    done = tasks.installed(building, {"name": "m", "version": "1", "files": {}, "variants": {}})
    assert tasks.get(task.id) == done and done.state == "installed"
    assert not tasks.bundle(task).exists()
    shown = done.as_json()
    assert not {"owner", "client", "build"} & set(shown) and shown["result"]["name"] == "m"
    other = tasks.ended(new(tasks), "rejected", "x", "why")
    assert not tasks.bundle(other).exists()
    assert [t.id for t in tasks.recent()] == [other.id, task.id]
    assert tasks.get(other.id).error == {"code": "x", "message": "why"}


def test_an_unfinished_record_left_behind_waits_for_the_next_server_while_its_bundle_is_kept(
    tmp_path: Path,
) -> None:
    tasks = InstallTasks(tmp_path)
    with ended_and_running() as (ended, running):
        host = durable.process_tag().partition("-")[0]
        gone, alive = f"{host}-{ended}", f"{host}-{running.pid}"
        # the pid of a running process that started after the owner: a container
        # restarted, its new server the same pid on the same host name
        reused = f"{host}-{running.pid}-00000000123"
        # owner, state, attempts, bundle kept, read as, claimable by a next server (which
        # ends the given-up one)
        for owner, state, attempts, bundle, expected, claimable in (
            (gone, "building", 1, True, "queued", True),  # a crash cut its build short
            (gone, "queued", 0, True, "queued", True),
            ("", "queued", 1, True, "queued", True),  # released by a stopping server
            (reused, "building", 1, True, "queued", True),
            (gone, "building", 1, False, "interrupted", False),  # before bundles were kept
            (gone, "building", MAX_ATTEMPTS, True, "interrupted", True),  # given up
            (alive, "building", 1, True, "building", False),
            ("0123abcd-1", "building", 1, True, "building", False),  # another host's
            (gone, "installed", 1, False, "installed", False),
        ):
            task = new(tasks)
            rewrite(tasks, task, owner=owner, state=state, attempts=attempts)
            if not bundle:
                shutil.rmtree(tasks.bundle(task))
            read = tasks.get(task.id)
            assert read is not None and read.state == expected, (owner, state, attempts)
            assert (task.id in {t.id for t in tasks.claimable()}) == claimable, owner
            if expected == "interrupted":
                assert read.error is not None and "send the bundle again" in read.error["message"]
                if attempts == MAX_ATTEMPTS:
                    assert f"{MAX_ATTEMPTS} times" in read.error["message"]


def test_one_server_claims_an_install_left_behind_and_it_is_given_up_after_its_attempts(
    tmp_path: Path,
) -> None:
    tasks, other = InstallTasks(tmp_path), InstallTasks(tmp_path)  # two servers, one dir
    with ended_and_running() as (ended, running):
        host = durable.process_tag().partition("-")[0]
        left = new(tasks, precisions=["int8"], build={"small": True})
        rewrite(tasks, left, owner=f"{host}-{ended}", state="building", attempts=1)
        mine = new(tasks)  # this process's, running: nothing to claim
        theirs = new(tasks)
        rewrite(tasks, theirs, owner=f"{host}-{running.pid}", state="building", attempts=1)
        assert [t.id for t in tasks.claimable()] == [left.id]

        claimed = tasks.claim(left.id)
        assert claimed is not None and claimed.state == "queued"
        assert claimed.owner == durable.process_tag() and claimed.attempts == 1
        assert (claimed.precisions, claimed.build) == (["int8"], {"small": True})
        assert (tasks.bundle(left) / "model.yaml").is_file()
        assert other.claim(left.id) is None  # the first server's now
        assert tasks.claim(mine.id) is None and tasks.claim(theirs.id) is None
        assert tasks.claimable() == []

        # a bundle being claimed by another server at this instant is not taken twice
        rewrite(tasks, left, owner="")
        held = tasks.bundle(left).with_name(f"{tasks.bundle(left).name}.someone-else")
        tasks.bundle(left).rename(held)
        assert other.claim(left.id) is None
        held.rename(tasks.bundle(left))

        rewrite(tasks, left, owner=f"{host}-{ended}", attempts=MAX_ATTEMPTS)
        ended_record = other.claim(left.id)
        assert ended_record is not None and ended_record.state == "interrupted"
        assert not tasks.bundle(left).exists()
        assert tasks.get(left.id).state == "interrupted"

        released = tasks.release(tasks.started(mine))  # a stopping server leaves it
        assert (released.state, released.owner) == ("queued", "")
        assert other.claim(mine.id) is not None


def test_ids_that_are_not_a_record_name_find_nothing(tmp_path: Path) -> None:
    tasks = InstallTasks(tmp_path)
    task = new(tasks)
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
    oldest = new(tasks, "0.zip")  # queued, owner running
    made = [tasks.ended(new(tasks, f"{n}.zip"), "failed", "e", "x") for n in range(1, 7)]
    kept = {t.id for t in tasks.recent(limit=100)}
    assert oldest.id in kept and tasks.bundle(oldest).is_dir()  # unfinished: never pruned
    assert {t.id for t in made[-3:]} <= kept and len(kept) == 4
    on_disk = {p.name.split(".")[0] for p in tasks.folder.iterdir()}
    assert on_disk == kept


def test_a_build_that_failed_after_its_install_is_recorded_as_installed(tmp_path: Path) -> None:
    """What follows the rename into the store (the catalog rescan, the audit record) may
    fail; the version is installed all the same, and its record must not say refused.
    Another install of the same version, or one of another source or key, is not ours."""
    from tests.factories.bundles import write_test_bundles
    from tests.factories.console import lesion_bundle

    from radserve.errors import BundleExistsError
    from radserve.lifecycle.install import finish_install, stage_bundle
    from radserve.service.install_queue import _installed_before
    from radserve.store.errors import StoreError

    models = write_test_bundles(tmp_path / "models")
    data = tmp_path / "data"
    folder = lesion_bundle(models, "1.9.0", tmp_path / "b")
    staged = stage_bundle(folder, data, described_as="HTTP upload (1 bytes)")
    task = new(InstallTasks(data), staged.source_name, actor="k1")
    away = StoreError("the database is away")
    assert _installed_before(task, data, staged, away) is None  # not yet
    assert _installed_before(task, data) is None
    finish_install(staged, actor="k1")
    record = _installed_before(task, data, staged, away)
    assert record is not None and (record.name, record.version) == ("lesions-test", "1.9.0")
    # a resumed build finds it by its source and key, not knowing the version
    assert _installed_before(task, data) == record
    assert _installed_before(task, data, staged, BundleExistsError("raced")) is None
    other = replace(task, actor="k2")
    assert _installed_before(other, data, staged, away) is None
    assert _installed_before(other, data) is None
    later = replace(task, created="2999-01-01T00:00:00.000000+00:00")  # made after it
    assert _installed_before(later, data) is None


def test_an_install_of_another_host_is_left_behind_once_its_process_stops_touching_it(
    tmp_path: Path,
) -> None:
    """Replicas of several hosts share the data dir: a process of another host cannot be
    asked whether it runs, so its records are judged by their file's time. One touched
    within LEASE_S is at work; one untouched longer is a dead host's, and claimed."""
    import os
    import time

    tasks = InstallTasks(tmp_path)
    task = new(tasks)
    rewrite(tasks, task, owner="0123abcd-4242-99", state="building", attempts=1)
    assert tasks.get(task.id).state == "building" and tasks.claimable() == []
    path = tasks.folder / f"{task.id}.json"
    old = time.time() - install_tasks.LEASE_S - 5
    os.utime(path, (old, old))
    assert tasks.get(task.id).state == "queued"  # waits for a server to build it again
    assert [t.id for t in tasks.claimable()] == [task.id]
    tasks.beat(task.id)  # its owner was only slow: it touches the record again
    assert tasks.get(task.id).state == "building" and tasks.claimable() == []
    os.utime(path, (old, old))
    claimed = tasks.claim(task.id)
    assert claimed is not None and claimed.owner == durable.process_tag()
    assert claimed.state == "queued" and claimed.attempts == 1
    tasks.beat("f" * 32)  # a record gone: nothing to touch, no error


def test_the_installs_queued_or_building_here_are_touched_until_they_end(
    tmp_path: Path,
) -> None:
    import os
    import threading
    import time

    from radserve.errors import ModelError
    from radserve.service.install_queue import BackgroundInstalls

    building, release = threading.Event(), threading.Event()

    class Lifecycle:  # the build's first step waits, then refuses the bundle
        def stage(self, bundle: Path, described_as: str) -> object:
            building.set()
            release.wait(10)
            raise ModelError("refused by the test")

    tasks = InstallTasks(tmp_path)
    left = new(tasks)
    rewrite(tasks, left, owner="", state="queued")  # released by a stopping server
    installs = BackgroundInstalls(Lifecycle(), tasks, beat_s=0.05)  # type: ignore[arg-type]
    assert installs.resume() == 1 and building.wait(10)
    path = tasks.folder / f"{left.id}.json"
    old = time.time() - 3600
    os.utime(path, (old, old))
    deadline = time.monotonic() + 10
    while path.stat().st_mtime < time.time() - 60 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.stat().st_mtime > time.time() - 60  # touched while it builds
    release.set()
    deadline = time.monotonic() + 10
    while tasks.get(left.id).state != "rejected" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tasks.get(left.id).state == "rejected"
    installs.stop()
    os.utime(path, (old, old))
    time.sleep(0.3)
    assert abs(path.stat().st_mtime - old) < 1  # ended: no longer touched


def test_a_running_server_claims_a_dead_host_s_install_without_a_restart(
    tmp_path: Path,
) -> None:
    """The other replicas keep running when one host dies: the install it was building
    is claimed by one of them once its lease has run out, not at some later start."""
    import os
    import threading
    import time

    from radserve.errors import ModelError
    from radserve.service.install_queue import BackgroundInstalls

    built = threading.Event()

    class Lifecycle:
        def stage(self, bundle: Path, described_as: str) -> object:
            built.set()
            raise ModelError("refused by the test")

    tasks = InstallTasks(tmp_path)
    installs = BackgroundInstalls(Lifecycle(), tasks, beat_s=0.05, claim_s=0.1)  # type: ignore[arg-type]
    assert installs.resume() == 0  # the start finds nothing
    task = new(tasks)
    rewrite(tasks, task, owner="0123abcd-4242-99", state="building", attempts=1)
    time.sleep(0.4)
    assert not built.is_set()  # its host's lease runs: it is not taken from it
    old = time.time() - install_tasks.LEASE_S - 5
    os.utime(tasks.folder / f"{task.id}.json", (old, old))
    assert built.wait(10)
    deadline = time.monotonic() + 10
    while tasks.get(task.id).state != "rejected" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tasks.get(task.id).attempts == 2
    installs.stop()
