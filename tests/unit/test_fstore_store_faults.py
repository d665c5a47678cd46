"""A store the operator's commands cannot use as it is: one line naming the file and
what is wrong, exit 2, and nothing created.

- a corrupt or truncated SQLite file (``keys list|create``, ``audit verify``, ``serve``
  printed ~130 lines with two tracebacks; ``doctor`` said "not reachable: DatabaseError");
- a schema a newer radserve wrote: doctor fails it in serve's words (it said "warn ...
  applied at start" and exited 0 while serve refused);
- a data dir that cannot be written: ``keys list`` and ``audit verify`` still read it
  (opened read-only), a writing command says the folder is read-only;
- ``keys revoke`` with a mistyped ``--data-dir``: "no radserve store at ..." (it created
  the folder, a store and an audit key, then said "no API key");
- doctor's low-disk row names the minimum that blocks serve (it said "0.0 GiB free");
- the serving lock of a SQLite store (:mod:`radserve.store.data_dir_lock`); two real
  servers: tests/integration/test_data_dir_in_use.py.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from tests.factories.server_process import run_radserve

from radserve.cli import cli
from radserve.config import load_settings
from radserve.store import init_store
from radserve.store.data_dir_lock import DataDirInUseError, acquire, holder, lock_path
from radserve.store.errors import NoDataError, SchemaNotCurrentError
from radserve.store.migrate import head_revision
from radserve.store.store import StoreUnreadableError

NEWER = "0099_from_the_future"


def _fresh_store(data: Path) -> Path:
    """A data dir with a store at head, an audit key and an admin key."""
    result = CliRunner().invoke(cli, ["keys", "create", "--role", "admin", "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    return data / "radserve.db"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- corrupt and truncated files ---------------------------------------------------------
def _corrupt(data: Path) -> Path:
    data.mkdir()
    database = data / "radserve.db"
    database.write_bytes(os.urandom(20_000))
    return database


def _truncated(data: Path) -> Path:
    database = _fresh_store(data)
    whole = database.read_bytes()
    database.write_bytes(whole[:8192])
    return database


def _bad_pages(data: Path) -> Path:
    """A store whose first pages read (the schema revision) but whose audit and key
    tables are garbage: the open passes, the first read of them fails."""
    database = _fresh_store(data)
    with closing(sqlite3.connect(database)) as connection:
        pages = connection.execute(
            "SELECT rootpage FROM sqlite_master WHERE name IN ('api_keys', 'audit_records')"
        ).fetchall()
        size = connection.execute("PRAGMA page_size").fetchone()[0]
    with open(database, "r+b") as handle:
        for (page,) in pages:
            handle.seek((page - 1) * size)
            handle.write(os.urandom(size))
    return database


BROKEN = {"corrupt": _corrupt, "truncated": _truncated, "bad pages": _bad_pages}
COMMANDS = [
    ["keys", "list"],
    ["keys", "create", "--role", "read"],
    ["audit", "verify"],
    ["audit", "export", "--out", "audit.jsonl"],
]


@pytest.mark.parametrize("make", BROKEN.values(), ids=BROKEN.keys())
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_broken_store_file_is_one_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    database = make(tmp_path / "data")
    result = _invoke(*args, "--data-dir", str(tmp_path / "data"))
    assert isinstance(result.exception, StoreUnreadableError), result.output
    message = result.exception.message
    assert f"the SQLite store {database} cannot be read: " in message
    assert "not a database" in message or "malformed" in message
    assert "corrupt" in message and "backup" in message


def test_serve_and_doctor_on_a_corrupt_store_say_one_line_naming_it(tmp_path: Path) -> None:
    database = _corrupt(tmp_path / "data")
    data = str(tmp_path / "data")
    served = run_radserve("serve", "--port", "0", "--data-dir", data, timeout=300)
    assert served.returncode == 2, served.stderr[-3000:]
    lines = [line for line in served.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in served.stderr, served.stderr[-3000:]
    assert lines[0].startswith(f"error [store_unreadable]: the SQLite store {database} ")
    assert "file is not a database" in lines[0]

    doctor = _invoke("doctor", "--no-ports", "--json", "--data-dir", data)
    row = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
    assert row["status"] == "fail" and row["blocking"], row
    assert f"the SQLite store {database} cannot be read: file is not a database" in row["detail"]


def test_a_folder_where_the_database_file_goes_is_named(tmp_path: Path) -> None:
    (tmp_path / "data" / "radserve.db").mkdir(parents=True)
    result = _invoke("keys", "create", "--role", "read", "--data-dir", str(tmp_path / "data"))
    assert isinstance(result.exception, StoreUnreadableError), result.output
    assert f"{tmp_path / 'data' / 'radserve.db'} is a folder" in result.exception.message
    doctor = _invoke("doctor", "--no-ports", "--json", "--data-dir", str(tmp_path / "data"))
    row = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
    assert row["status"] == "fail" and "is a folder" in row["detail"], row


# --- a schema a newer radserve wrote -----------------------------------------------------
def test_doctor_fails_a_newer_schema_in_the_words_serve_refuses_it(tmp_path: Path) -> None:
    url = f"sqlite:///{_fresh_store(tmp_path / 'data')}"
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (NEWER,))
        connection.commit()
    with pytest.raises(SchemaNotCurrentError) as refused:
        init_store(url, schema="upgrade")  # what serve opens the store with
    doctor = _invoke("doctor", "--no-ports", "--json", "--data-dir", str(tmp_path / "data"))
    row = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
    assert row["status"] == "fail" and row["blocking"] is True, row
    assert row["detail"] == refused.value.message
    assert NEWER in row["detail"] and "a newer radserve wrote it" in row["detail"]
    assert doctor.exit_code == 1


def test_doctor_still_passes_an_older_schema_that_serve_upgrades(tmp_path: Path) -> None:
    url = f"sqlite:///{_fresh_store(tmp_path / 'data')}"
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0001_initial'")
        connection.commit()
    doctor = _invoke("doctor", "--no-ports", "--json", "--data-dir", str(tmp_path / "data"))
    row = next(c for c in json.loads(doctor.stdout) if c["name"] == "database")
    assert row["status"] == "warn", row
    assert f"{head_revision()} is applied at start" in row["detail"]


# --- a data dir that cannot be written ---------------------------------------------------
def test_a_store_in_a_folder_that_cannot_be_written_is_read_without_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the kernel says of read-only media (EROFS; root ignores mode bits, so the
    test tells the store so): keys list and audit verify read it through an immutable
    open, and nothing appears beside it (no -wal, -shm or lock file)."""
    _fresh_store(tmp_path / "data")
    before = _files(tmp_path / "data")
    monkeypatch.setattr("radserve.store.store.writable", lambda _database: False)
    listed = _invoke("keys", "list", "--json", "--data-dir", str(tmp_path / "data"))
    assert listed.exit_code == 0, listed.output
    assert [json.loads(line)["role"] for line in listed.stdout.splitlines()] == ["admin"]
    verified = _invoke("audit", "verify", "--data-dir", str(tmp_path / "data"))
    assert verified.exit_code == 0, verified.output
    assert _files(tmp_path / "data") == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a folder whatever its mode")
def test_a_read_only_folder_is_read_and_a_write_is_refused_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    database = _fresh_store(data)
    os.chmod(data, 0o555)
    try:
        listed = _invoke("keys", "list", "--data-dir", str(data))
        assert listed.exit_code == 0, listed.output
        created = _invoke("keys", "create", "--role", "read", "--data-dir", str(data))
        assert isinstance(created.exception, StoreUnreadableError), created.output
        assert f"the SQLite store {database} is in a read-only folder" in (
            created.exception.message
        )
    finally:
        os.chmod(data, 0o755)


# --- keys revoke in the wrong folder -----------------------------------------------------
def test_keys_revoke_in_a_mistyped_data_dir_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "dta"
    result = _invoke("keys", "revoke", "deadbeefdeadbeef", "--data-dir", str(typo))
    assert isinstance(result.exception, NoDataError), result.output
    assert result.exception.message.startswith(f"no radserve store at {typo} ")
    assert "nothing was created" in result.exception.message
    assert _files(tmp_path) == []
    other = tmp_path / "other"  # a folder that exists but holds no store: none added
    other.mkdir()
    result = _invoke("keys", "revoke", "deadbeefdeadbeef", "--data-dir", str(other))
    assert isinstance(result.exception, NoDataError), result.output
    assert _files(tmp_path) == ["other"]


# --- doctor's disk row -------------------------------------------------------------------
def test_doctor_names_the_free_space_serve_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radserve.lifecycle import doctor

    free = 40 * 1024**2

    class Usage:
        total, used = 100 * 1024**3, 100 * 1024**3 - free

    Usage.free = free  # type: ignore[attr-defined]
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda _folder: Usage)
    settings = load_settings(data_dir=tmp_path, gateway__enabled=True)
    check = doctor._disk(settings)
    assert check.status == "fail" and check.blocking
    assert check.detail.startswith(f"40 MiB free in {tmp_path}; ")
    assert "`radserve serve` needs at least 1.0 GiB free there to start" in check.detail
    assert "gateway.min_free_bytes (512 MiB)" in check.detail


# --- the serving lock --------------------------------------------------------------------
def test_the_serving_lock_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    database = tmp_path / "data" / "radserve.db"
    assert holder(database) is None and not (tmp_path / "data").exists()  # created nothing
    with acquire(database, data_dir=tmp_path / "data"):
        found = holder(database)
        assert found is not None and found.pid == os.getpid()
        with pytest.raises(DataDirInUseError) as refused:
            acquire(database, data_dir=tmp_path / "data", wait_s=0.1)
        assert f"the data dir {tmp_path / 'data'} is in use" in refused.value.message
        assert f"pid {os.getpid()} on this host" in refused.value.message
    assert holder(database) is None
    acquire(database, data_dir=tmp_path / "data").release()  # free again
    assert lock_path(database).exists()  # kept: removing it would race a starting server


def test_the_kernel_releases_the_lock_of_a_killed_server(tmp_path: Path) -> None:
    database = tmp_path / "radserve.db"
    code = (
        "import sys, time; from pathlib import Path;"
        "from radserve.store.data_dir_lock import acquire;"
        f"lock = acquire(Path({str(database)!r}), data_dir=Path({str(tmp_path)!r}));"
        "print('held', flush=True); time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        found = holder(database)
        assert found is not None and found.pid == child.pid
        with pytest.raises(DataDirInUseError, match=f"pid {child.pid} "):
            acquire(database, data_dir=tmp_path, wait_s=0.1)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        assert holder(database) is None
        acquire(database, data_dir=tmp_path, wait_s=0).release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)


def test_only_a_store_that_is_not_shared_is_locked(tmp_path: Path) -> None:
    from radserve.commands.serve import hold_store

    lock = hold_store(load_settings(data_dir=tmp_path / "data"))
    assert lock is not None and lock.held
    lock.release()
    replicas = load_settings(data_dir=tmp_path / "data", outbox__replicas=2)
    assert hold_store(replicas) is None  # job leases share the jobs
    postgres = load_settings(
        data_dir=tmp_path / "pg", database_url="postgresql+psycopg://u@127.0.0.1:1/x"
    )
    assert hold_store(postgres) is None
    assert not (tmp_path / "pg").exists()
