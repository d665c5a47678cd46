"""A damaged or hostile bundle zip is refused with its reason, never a traceback
(2026-12-08 trial: AI team / hostile client).

Before, each of these ended ``POST /v1/models`` in HTTP 500 ``internal_error`` (and
``radserve models install`` in a traceback), from an exception zipfile, zlib or lzma
raises that the install did not expect:

* a ZIP64 end-of-directory locator whose offset lies past any file (``OverflowError``
  from radserve's own end-record read) or that claims several disks (``BadZipFile``
  raised by ``zipfile.is_zipfile`` itself, which the route called unguarded);
* a member name flagged UTF-8 that is not (``UnicodeDecodeError``);
* an encrypted member (``RuntimeError``) and one compressed with Deflate64, what
  Windows' Explorer writes for large archives (``NotImplementedError``);
* damaged Deflate and LZMA data (``zlib.error``, ``LZMAError``);
* a member with an empty name (``IndexError`` from ``ZipInfo.is_dir``; found by
  mutating the central directory) and one named ``.`` (it was written as a file where
  the bundle's folder goes, then refused naming another member).

Nothing is left in the store or among the uploads after any of them, and a sound zip
still installs.
"""

from __future__ import annotations

import io
import random
import struct
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.bundles import write_test_bundles
from tests.factories.host import CPU_HOST
from tests.factories.service import auth, config_file, live_server

from radserve.config import load_settings
from radserve.errors import BundleRejectedError
from radserve.lifecycle.install import STAGING_DIR, UPLOADS_DIR, install_bundle, models_root


def _files(folder: Path, version: str) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    files["model.yaml"] = files["model.yaml"].replace(
        b"version: 1.0.0", f"version: {version}".encode()
    )
    return files


def _zip(files: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def _with_locator(archive: bytes, disk: int, offset: int, disks: int) -> bytes:
    """``archive`` with a ZIP64 end-of-directory locator put before its end record."""
    at = archive.rfind(b"PK\x05\x06")
    locator = struct.pack("<4sIQI", b"PK\x06\x07", disk, offset, disks)
    return archive[:at] + locator + archive[at:]


def _set_in_headers(archive: bytes, change: Callable[[bytearray, int, bool], None]) -> bytes:
    """``change(data, at, central)`` applied at every local and central header."""
    data = bytearray(archive)
    for signature, central in ((b"PK\x03\x04", False), (b"PK\x01\x02", True)):
        at = data.find(signature)
        while at >= 0:
            change(data, at, central)
            at = data.find(signature, at + 4)
    return bytes(data)


def _encrypted(data: bytearray, at: int, central: bool) -> None:
    data[at + (8 if central else 6)] |= 0x1  # general purpose flag bit 0


def _deflate64(data: bytearray, at: int, central: bool) -> None:
    offset = at + (10 if central else 8)
    data[offset : offset + 2] = struct.pack("<H", 9)


def _damaged(files: dict[str, bytes], method: int) -> bytes:
    """model.onnx's compressed data damaged: Deflate's first block given the reserved
    type 3, LZMA's stream overwritten after its 9-byte header."""
    noise = random.Random(0).randbytes(4096)  # long compressed data to damage
    data = bytearray(_zip({**files, "model.onnx": noise + files["model.onnx"]}, method))
    start = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo("model.onnx").header_offset
    (name, extra) = struct.unpack_from("<HH", data, start + 26)
    start += 30 + name + extra
    if method == zipfile.ZIP_DEFLATED:
        data[start] = 0xFF
    else:
        data[start + 9 : start + 49] = bytes(b ^ 0x5A for b in data[start + 9 : start + 49])
    return bytes(data)


def _bad_utf8_name(files: dict[str, bytes]) -> bytes:
    data = _zip({**files, "notes-\u00e9.txt": b"read me"})
    return data.replace("notes-\u00e9".encode(), b"notes-\xff\xa9")


def _empty_name(files: dict[str, bytes]) -> bytes:
    data = _zip({**files, "x": b"x"})
    # the one-character name "x" (local and central header) becomes a name of length 0
    change = bytearray(data)

    def emptied(raw: bytearray, at: int, central: bool) -> None:
        length_at, name_at = (at + 28, at + 46) if central else (at + 26, at + 30)
        (length,) = struct.unpack_from("<H", raw, length_at)
        if raw[name_at : name_at + length] == b"x":
            raw[length_at : length_at + 2] = b"\x00\x00"
            raw[name_at : name_at + 1] = b""

    data = _set_in_headers(bytes(change), emptied)
    # the central directory moved by one byte less per removed name: fix its offset
    end = data.rfind(b"PK\x05\x06")
    first_central = data.find(b"PK\x01\x02")
    raw = bytearray(data)
    raw[end + 16 : end + 20] = struct.pack("<I", first_central)
    raw[end + 12 : end + 16] = struct.pack("<I", end - first_central)
    return bytes(raw)


CASES: dict[str, tuple[Callable[[dict[str, bytes]], bytes], str]] = {
    "zip64_locator_past_the_file": (
        lambda f: _with_locator(_zip(f), 0, 2**63 + 5, 1),
        "is not a readable zip: Bad magic number for central directory",  # zipfile's words
    ),
    "zip64_locator_several_disks": (
        lambda f: _with_locator(_zip(f), 3, 0, 7),
        "is not a readable zip: zipfiles that span multiple disks are not supported",
    ),
    "name_not_utf8": (_bad_utf8_name, "is not a readable zip: 'utf-8' codec can't decode"),
    "encrypted_member": (
        lambda f: _set_in_headers(_zip(f), _encrypted),
        "is encrypted; zip the bundle without a password",
    ),
    "deflate64_member": (
        lambda f: _set_in_headers(_zip(f), _deflate64),
        "cannot be read: compression method 9 (deflate64) is not supported; zip the "
        "bundle with Deflate",
    ),
    "damaged_deflate": (
        lambda f: _damaged(f, zipfile.ZIP_DEFLATED),
        "cannot extract 'model.onnx': Error -3 while decompressing data: invalid block type",
    ),
    "damaged_lzma": (
        lambda f: _damaged(f, zipfile.ZIP_LZMA),
        "cannot extract 'model.onnx': Corrupt input data",
    ),
    "empty_member_name": (_empty_name, "the archive has a member with an empty name"),
    "member_named_dot": (
        lambda f: _zip({".": b"x", **f}),
        "archive member '.' has no file name",
    ),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundles")
    write_test_bundles(root)
    return root / "organs-test" / "1.0.0"


def _store_is_empty(data_dir: Path) -> None:
    root = models_root(data_dir)
    left = [
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if not p.relative_to(root).as_posix().startswith((STAGING_DIR, UPLOADS_DIR))
    ]
    assert left == [], left
    for folder in (STAGING_DIR, UPLOADS_DIR):
        assert not (root / folder).is_dir() or not list((root / folder).iterdir())


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_install_refuses_a_damaged_zip_by_its_reason(
    case: str, source: Path, tmp_path: Path
) -> None:
    make, reason = CASES[case]
    archive = tmp_path / "bundle.zip"
    archive.write_bytes(make(_files(source, "7.0.0")))
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(archive, tmp_path / "data", host=CPU_HOST)
    assert reason in refused.value.message
    _store_is_empty(tmp_path / "data")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("server")
    settings = load_settings(config_file(root), data_dir=root / "data")
    with live_server(settings, roles=("admin",), warm=False) as live:
        yield {**live, "data_dir": settings.data_dir}


def test_the_api_answers_422_with_the_reason_for_each_damaged_zip(
    server: dict[str, Any], source: Path
) -> None:
    answers = {}
    for version, case in enumerate(sorted(CASES), start=1):
        make, reason = CASES[case]
        body = make(_files(source, f"7.0.{version}"))
        answer = server["client"].post("/v1/models", content=body, headers=auth(server["admin"]))
        error = answer.json().get("error", {})
        answers[case] = (answer.status_code, error.get("code"), reason in error.get("message", ""))
    assert answers == {case: (422, "bundle_rejected", True) for case in CASES}, answers
    _store_is_empty(server["data_dir"])
    # a sound zip still installs
    answer = server["client"].post(
        "/v1/models", content=_zip(_files(source, "7.1.0")), headers=auth(server["admin"])
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["version"] == "7.1.0"
