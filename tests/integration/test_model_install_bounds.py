"""A model bundle offered for install is bounded before it costs anything (2026-12-07 trial).

* A zip's entry count and central directory size are read from its end record before
  zipfile parses the directory: a 103 MB zip of 1.2 million empty entries took the
  server from 286 MB to 911 MB (the CLI to 794 MB) before "holds 1200000 entries", and
  the refusal named the server's temporary file instead of the uploaded zip.
* An upload to ``POST /v1/models`` that the client abandons leaves no part file (it
  stayed until the next server start).
* model.yaml deeper than the limit is named where it was found, and a folder install
  walks no deeper than that (it walked the whole tree given, then said "no model.yaml").
* A zip member whose name holds a control character (a newline, a terminal escape) is
  refused by its escaped name (it was installed and kept).
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.bundles import write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.service import auth, config_file, live_server
from tests.factories.waits import until

from radserve.config import load_settings
from radserve.errors import BundleRejectedError
from radserve.lifecycle.install import MAX_BUNDLE_DEPTH, UPLOADS_DIR, install_bundle, models_root

HOST = CPU_HOST
ENTRIES = 300_000
# what parsing ENTRIES directory entries costs (ZipInfo objects): ~150 MB
PARSED_BYTES = 20 * 1024**2


def _many_entries(path: Path, entries: int = ENTRIES, *, listed: int | None = None) -> Path:
    """A zip of ``entries`` empty stored entries named "a", written as its central
    directory alone (zipfile reads no local header to parse it): 47 bytes an entry.
    ``listed``: the count its end record gives (no ZIP64 record); default the true count,
    in ZIP64 records as zipfile writes them past 65,535 entries."""
    entry = struct.pack(
        "<4s6H3I5HII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0
    )
    directory = (entry + b"a") * entries
    size = len(directory)
    if listed is None:
        zip64 = struct.pack(
            "<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, size, 0
        )
        locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, size, 1)
        end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0, 0)
        path.write_bytes(directory + zip64 + locator + end)
    else:
        end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, listed, listed, size, 0, 0)
        path.write_bytes(directory + end)
    assert zipfile.is_zipfile(path)
    return path


def _peak(call: Any) -> tuple[Exception, int]:
    """What ``call()`` raised and the peak of Python memory it allocated."""
    tracemalloc.start()
    try:
        call()
    except Exception as exc:
        raised = exc
    else:
        raise AssertionError("it was not refused")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return raised, peak


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "lesions-test" / "1.0.0"


def _zip(folder: Path, target: Path, prefix: str, extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{prefix}/{path.relative_to(folder).as_posix()}")
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return target


# --- the entry count, before the directory is parsed -----------------------------------------
def test_a_zip_of_too_many_entries_is_refused_before_its_directory_is_parsed(
    tmp_path: Path,
) -> None:
    archive = _many_entries(tmp_path / "many.zip")
    assert archive.stat().st_size < 16 * 1024**2
    raised, peak = _peak(lambda: install_bundle(archive, tmp_path / "data", host=HOST))
    assert peak < PARSED_BYTES, f"{peak} bytes allocated: the directory was parsed"
    assert isinstance(raised, BundleRejectedError), raised
    # named as the CLI's user gave it, not by its file name alone
    assert raised.message == f"{archive} holds {ENTRIES} entries; at most 256"


def test_an_end_record_that_understates_the_entries_is_refused_by_the_directory_size(
    tmp_path: Path,
) -> None:
    """zipfile parses every byte of the directory whatever count the end record gives."""
    archive = _many_entries(tmp_path / "lying.zip", listed=3)
    raised, peak = _peak(lambda: install_bundle(archive, tmp_path / "data", host=HOST))
    assert peak < PARSED_BYTES, f"{peak} bytes allocated: the directory was parsed"
    assert isinstance(raised, BundleRejectedError), raised
    assert f"has a central directory of {ENTRIES * 47} bytes" in raised.message


# --- through the API: the refusal's name, and an abandoned upload -------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("server")
    settings = load_settings(config_file(root), data_dir=root / "data")
    with live_server(settings, roles=("admin",), warm=False) as live:
        yield {**live, "uploads": models_root(settings.data_dir) / UPLOADS_DIR}


def test_the_api_names_the_uploaded_zip_and_keeps_no_upload(
    server: dict[str, Any], tmp_path: Path
) -> None:
    archive = _many_entries(tmp_path / "many.zip")
    answer = server["client"].post(
        "/v1/models", content=archive.read_bytes(), headers=auth(server["admin"])
    )
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert message == f"the uploaded zip holds {ENTRIES} entries; at most 256"
    assert not list(server["uploads"].iterdir())


def test_an_abandoned_upload_leaves_no_part_file(server: dict[str, Any]) -> None:
    uploads: Path = server["uploads"]
    head = (
        "POST /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {server['admin']}\r\n"
        "Content-Type: application/zip\r\nContent-Length: 52428800\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=30) as sock:
        sock.sendall(head + b"\0" * (2 << 20))

        def receiving() -> list[Path]:
            return [p for p in uploads.iterdir() if p.stat().st_size > 0]

        until(receiving, "the upload to be written", 30)
    until(
        lambda: not list(uploads.iterdir()),
        "the abandoned upload's part file to be removed",
        10,
        state=lambda: list(uploads.iterdir()),
    )
    # the server still answers
    answer = server["client"].get("/v1/models", headers=auth(server["admin"]))
    assert answer.status_code == 200, answer.text


# --- where model.yaml is -------------------------------------------------------------------------
def test_a_zip_with_model_yaml_too_deep_says_where_it_is(bundle: Path, tmp_path: Path) -> None:
    archive = _zip(bundle, tmp_path / "deep.zip", "a/b/c/d")
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(archive, tmp_path / "data", host=HOST)
    assert (
        f"model.yaml found at a/b/c/d/model.yaml, deeper than {MAX_BUNDLE_DEPTH} folders"
        in refused.value.message
    ), refused.value.message
    # 3 folders down is the limit, and installs
    shallow = _zip(bundle, tmp_path / "shallow.zip", "a/b/c")
    assert install_bundle(shallow, tmp_path / "data", host=HOST).name == "lesions-test"


def test_a_folder_install_walks_no_deeper_than_the_limit(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(bundle, tree / "a" / "b" / "c" / "d")
    far = tree.joinpath(*"stuvwxyz")  # a big tree given by mistake: nothing here is read
    far.mkdir(parents=True)
    (far / "model.yaml").write_text("never read")
    listed: list[Path] = []
    scandir = os.scandir

    def spy(path: Any = ".") -> Any:
        if not isinstance(path, int):  # shutil.rmtree lists by file descriptor
            listed.append(Path(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", spy)
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(tree, tmp_path / "data", host=HOST)
    monkeypatch.undo()
    depths = [len(p.relative_to(tree).parts) for p in listed if p.is_relative_to(tree)]
    assert depths and max(depths) <= MAX_BUNDLE_DEPTH + 1, sorted(set(depths))
    assert refused.value.message.startswith(
        f"model.yaml found at a/b/c/d/model.yaml, deeper than {MAX_BUNDLE_DEPTH} folders in {tree}"
    ), refused.value.message


def test_a_folder_without_model_yaml_says_how_deep_it_looked(tmp_path: Path) -> None:
    (tmp_path / "empty" / "x").mkdir(parents=True)
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(tmp_path / "empty", tmp_path / "data", host=HOST)
    assert refused.value.message == (
        f"{tmp_path / 'empty'} holds no model.yaml in its top folder or up to "
        f"{MAX_BUNDLE_DEPTH} folders below it"
    )


# --- names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["notes\n.txt", "\x1b[31mred.txt", "a\rb/c.txt", "x\u202et.txt"])
def test_a_member_name_with_a_control_character_is_refused_by_its_escaped_name(
    bundle: Path, tmp_path: Path, name: str
) -> None:
    member = f"lesions-test/1.0.0/{name}"
    archive = _zip(bundle, tmp_path / "b.zip", "lesions-test/1.0.0", {member: b"x"})
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(archive, tmp_path / "data", host=HOST)
    assert repr(member) in refused.value.message
    assert "control character" in refused.value.message
    assert not any(c in refused.value.message for c in "\n\r\x1b\u202e")
    assert not (tmp_path / "data" / "models" / "lesions-test").exists()
