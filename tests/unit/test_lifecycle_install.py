"""Model install: a bundle folder or zip is validated (manifest, ONNX graph against it,
host requirements), hashed and copied; hostile zips and mismatched graphs are refused."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from tests.factories.bundles import write_test_bundles
from tests.factories.onnx_models import threshold_model
from tests.factories.syncs import logged_syncs
from tests.factories.writers import ended_and_running

from radserve import durable
from radserve.errors import BundleExistsError, BundleRejectedError
from radserve.lifecycle.install import (
    ArchiveLimits,
    install_bundle,
    read_install,
    remove_interrupted_installs,
    sha256_file,
    upload_path,
    verify_install,
)
from radserve.lifecycle.requirements import HostFacts, unmet_requirements
from radserve.models.manifest import load_manifest
from radserve.models.registry import ModelRegistry

HOST = HostFacts(
    ort_version="1.24.1",
    providers=("CPUExecutionProvider",),
    runs_bf16=False,
    free_memory_mb=4096,
)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    write_test_bundles(tmp_path / "src")
    return tmp_path / "src" / "lesions-test" / "1.0.0"


def _zip(folder: Path, target: Path, prefix: str = "lesions-test/1.0.0") -> Path:
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{prefix}/{path.relative_to(folder).as_posix()}")
    return target


def test_install_a_folder_records_every_hash_and_the_registry_finds_it(
    bundle: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    installed = install_bundle(bundle, data, actor="tester", host=HOST)
    target = data / "models" / "lesions-test" / "1.0.0"
    assert installed.directory == target
    assert installed.files["model.onnx"] == sha256_file(bundle / "model.onnx")
    assert set(installed.files) == {"model.onnx", "model.yaml"}
    assert read_install(target) is not None and read_install(target).actor == "tester"  # type: ignore[union-attr]
    assert verify_install(target) == []
    assert ModelRegistry([data / "models"]).get("lesions-test").directory == target
    (target / "model.onnx").write_bytes(b"changed")
    assert verify_install(target) == ["model.onnx changed since install"]


def test_a_hard_link_out_of_the_bundle_is_installed_as_a_copy_of_its_content(
    bundle: Path, tmp_path: Path
) -> None:
    """A bundle file hard-linked to a file outside the bundle (st_nlink 2) is read like any
    file: the install holds its own copy (its own inode, one link), so a later in-place
    write to the outside file changes nothing installed. The data dir is on the same file
    system here, where a link-preserving copy could have shared the inode."""
    outside = tmp_path / "outside.onnx"
    os.replace(bundle / "model.onnx", outside)
    os.link(outside, bundle / "model.onnx")
    assert (bundle / "model.onnx").stat().st_nlink == 2
    original = outside.read_bytes()
    installed = install_bundle(bundle, tmp_path / "data", actor="tester", host=HOST)
    copied = installed.directory / "model.onnx"
    assert copied.stat().st_nlink == 1 and copied.stat().st_ino != outside.stat().st_ino
    with outside.open("r+b") as writer:  # in place: the same inode, new bytes
        writer.write(b"changed")
    assert copied.read_bytes() == original
    assert verify_install(installed.directory) == []


def test_a_version_is_never_replaced(bundle: Path, tmp_path: Path) -> None:
    install_bundle(bundle, tmp_path / "data", host=HOST)
    with pytest.raises(BundleExistsError, match="never replaced"):
        install_bundle(bundle, tmp_path / "data", host=HOST)
    with pytest.raises(BundleExistsError):
        install_bundle(
            _zip(bundle, tmp_path / "b.zip"),
            tmp_path / "other",
            host=HOST,
            existing={("lesions-test", "1.0.0")},
        )


@pytest.mark.parametrize("given", ["folder", "zip"])
def test_every_staged_file_and_folder_is_fsynced_before_the_rename_and_its_folder_after(
    given: str, bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = bundle if given == "folder" else _zip(bundle, tmp_path / "b.zip")
    log = logged_syncs(monkeypatch)
    target = install_bundle(source, tmp_path / "data", host=HOST).directory
    moved = next(i for i, e in enumerate(log) if e[0] == "rename" and e[2] == str(target))
    staged = log[moved][1]
    whole = {staged} | {f"{staged}/{p.relative_to(target)}" for p in target.rglob("*")}
    assert len(whole) == 4  # the folder, model.yaml, model.onnx, install.json
    assert whole <= {e[1] for e in log[:moved] if e[0] == "fsync"}
    assert ("fsync", str(target.parent)) in log[moved + 1 :]
    # the bundle's new name folder (lesions-test/) is itself a durable name in models/
    new_name = log.index(("fsync", str(target.parent.parent)))
    assert new_name < moved


def test_install_a_zip(bundle: Path, tmp_path: Path) -> None:
    installed = install_bundle(_zip(bundle, tmp_path / "b.zip"), tmp_path / "data", host=HOST)
    assert (installed.directory / "model.onnx").is_file()
    assert not any((tmp_path / "data" / "models" / ".staging").iterdir())


@pytest.mark.parametrize("member", ["../evil.txt", "/abs/evil.txt", "a/../../evil.txt"])
def test_zip_members_outside_the_bundle_are_refused(
    bundle: Path, tmp_path: Path, member: str
) -> None:
    archive = _zip(bundle, tmp_path / "b.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(member, "x")
    with pytest.raises(BundleRejectedError, match="outside the bundle"):
        install_bundle(archive, tmp_path / "data", host=HOST)
    assert not (tmp_path / "evil.txt").exists() and not Path("/abs/evil.txt").exists()


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ([("x", b"a"), ("x/", None)], "needs a folder where another member is a file"),
        ([("x", b"a"), ("x/y", b"b")], "needs a folder where another member is a file"),
        ([("/".join(["d"] * 2000) + "/f", b"a")], "cannot extract 'lesions-test/1.0.0/d/d/"),
        ([("a" * 300, b"a")], "File name too long"),
    ],
)
def test_zip_members_the_file_system_cannot_hold_are_refused_by_name(
    bundle: Path, tmp_path: Path, members: list[tuple[str, bytes | None]], reason: str
) -> None:
    """A name that is a file in one member and a folder in another, or a path too deep
    for the file system: before, a FileExistsError or OSError traceback (HTTP 500)."""
    archive = _zip(bundle, tmp_path / "b.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        for name, data in members:
            if data is None:
                zf.writestr(zipfile.ZipInfo(f"lesions-test/1.0.0/{name}"), b"")
            else:
                zf.writestr(f"lesions-test/1.0.0/{name}", data)
    with pytest.raises(BundleRejectedError, match=re.escape(reason)):
        install_bundle(archive, tmp_path / "data", host=HOST)
    assert not (tmp_path / "data" / "models" / "lesions-test").exists()


def test_zip_bomb_and_symlink_are_refused(bundle: Path, tmp_path: Path) -> None:
    bomb = _zip(bundle, tmp_path / "bomb.zip")
    with zipfile.ZipFile(bomb, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("lesions-test/1.0.0/zeros.bin", b"\0" * (8 << 20))
    with pytest.raises(BundleRejectedError, match="expands"):
        install_bundle(bomb, tmp_path / "data", host=HOST, limits=ArchiveLimits(max_ratio=10))
    link = _zip(bundle, tmp_path / "link.zip")
    with zipfile.ZipFile(link, "a") as zf:
        info = zipfile.ZipInfo("lesions-test/1.0.0/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(BundleRejectedError, match="link or special"):
        install_bundle(link, tmp_path / "data", host=HOST)
    too_many = _zip(bundle, tmp_path / "many.zip")
    with pytest.raises(BundleRejectedError, match="entries"):
        install_bundle(too_many, tmp_path / "data", host=HOST, limits=ArchiveLimits(max_members=1))
    not_zip = tmp_path / "x.bin"
    not_zip.write_bytes(b"garbage")
    with pytest.raises(BundleRejectedError, match="neither"):
        install_bundle(not_zip, tmp_path / "data", host=HOST)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("version", "../../outside"),
        ("version", "/tmp/outside-abs"),
        ("version", "1.0.0/nested"),
        ("name", "/tmp/outside-name"),
        ("name", ".installs"),
        ("name", ".."),
        ("version", "..\\x"),
    ],
)
def test_a_name_or_version_that_is_no_folder_name_is_refused_and_nothing_written(
    bundle: Path, tmp_path: Path, field: str, value: str
) -> None:
    """The bundle's folder is models/<name>/<version>: before session 35 a version
    ``../../x`` or a name ``/tmp/x`` installed it there, outside the data dir (API, CLI
    and nnU-Net importer alike), and a name ``.installs`` into radserve's own folders."""
    hostile = tmp_path / "hostile"
    shutil.copytree(bundle, hostile)
    manifest = yaml.safe_load((hostile / "model.yaml").read_text())
    manifest[field] = value
    (hostile / "model.yaml").write_text(yaml.safe_dump(manifest))
    before = set(tmp_path.rglob("*"))
    with pytest.raises(BundleRejectedError, match=f"model {field} "):
        install_bundle(hostile, tmp_path / "data", host=HOST)
    written = {p for p in set(tmp_path.rglob("*")) - before if ".staging" not in p.parts}
    assert not [p for p in written if p.is_file()], written
    assert not Path("/tmp/outside-abs").exists() and not Path("/tmp/outside-name").exists()


def test_onnx_graph_must_match_the_manifest(bundle: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    threshold_model(broken / "model.onnx", in_channels=1)  # manifest: 2.5d, 3 channels
    with pytest.raises(BundleRejectedError, match="has 1 channels; the manifest implies 3"):
        install_bundle(broken, tmp_path / "data", host=HOST)
    (broken / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(BundleRejectedError, match="not a readable ONNX model"):
        install_bundle(broken, tmp_path / "data", host=HOST)
    (broken / "model.onnx").unlink()
    with pytest.raises(BundleRejectedError, match="missing"):
        install_bundle(broken, tmp_path / "data", host=HOST)
    assert not (tmp_path / "data" / "models" / "lesions-test").exists()


@pytest.mark.parametrize(
    ("domain", "version", "ir_version", "reason"),
    [
        ("", 99, 8, r"imports opset 99 of ai\.onnx; ONNX Runtime [\d.]+ implements up to \d+"),
        ("", 17, 99, r"its IR version is 99; ONNX Runtime [\d.]+ reads up to \d+"),
        ("com.microsoft", 50, 8, r"imports opset 50 of com\.microsoft; .* implements up to 1"),
    ],
)
def test_a_graph_this_hosts_onnx_runtime_cannot_load_is_refused_at_install(
    bundle: Path, tmp_path: Path, domain: str, version: int, ir_version: int, reason: str
) -> None:
    """Until session 36 such a graph installed (read, not run) and only its deploy failed."""
    import onnx

    graph = onnx.load(str(bundle / "model.onnx"))
    if domain:
        graph.opset_import.append(onnx.helper.make_opsetid(domain, version))
    else:
        graph.opset_import[0].version = version
    graph.ir_version = ir_version
    onnx.save(graph, str(bundle / "model.onnx"))
    with pytest.raises(BundleRejectedError) as refused:
        install_bundle(bundle, tmp_path / "data", host=HOST)
    assert "(model.onnx): this host cannot load the graph: " in refused.value.message
    assert re.search(reason, refused.value.message), refused.value.message
    assert not (tmp_path / "data" / "models" / "lesions-test").exists()


def test_requirements_the_host_cannot_meet_are_refused_with_the_reason(
    bundle: Path, tmp_path: Path
) -> None:
    manifest = yaml.safe_load((bundle / "model.yaml").read_text())
    manifest["requires"] = {
        "onnxruntime": "9.0",
        "opset": 99,
        "providers": ["TensorrtExecutionProvider"],
        "memory_mb": 10**7,
    }
    (bundle / "model.yaml").write_text(yaml.safe_dump(manifest))
    reasons = unmet_requirements(load_manifest(bundle / "model.yaml"), HOST)
    assert len(reasons) == 4
    with pytest.raises(BundleRejectedError) as info:
        install_bundle(bundle, tmp_path / "data", host=HOST)
    for text in ("ONNX Runtime >= 9.0", "opset 99", "TensorrtExecutionProvider", "MB of free"):
        assert text in info.value.message
    manifest["requires"] = {"onnxruntime": "1.17", "opset": 17}
    (bundle / "model.yaml").write_text(yaml.safe_dump(manifest))
    assert install_bundle(bundle, tmp_path / "data", host=HOST).version == "1.0.0"


def test_the_start_sweep_removes_what_stopped_installs_left_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    models = tmp_path / "models"
    hour_ago = time.time() - 3600
    with ended_and_running() as (ended, running):
        # this version's: named by their owner (a dead one's go, a running one's stay)
        dead = durable.temporary_path(models / ".staging" / "install", pid=ended)
        live = durable.temporary_path(models / ".staging" / "install", pid=running.pid)
        dead_upload = upload_path(tmp_path).with_name(
            durable.temporary_path(models / ".uploads" / "bundle.zip", pid=ended).name
        )
        # an older version's (tempfile's names): gone once untouched and held by nobody
        old, fresh, held = (models / ".staging" / n for n in ("tmpold", "tmpnew", "tmpheld"))
        old_upload, fresh_upload = (
            models / ".uploads" / "tmpa.zip",
            models / ".uploads" / "tmpb.zip",
        )
        for folder in (dead, live, old, fresh, held):
            (folder / "zip" / "b").mkdir(parents=True)
            (folder / "zip" / "b" / "model.yaml").write_text("name: x\n")
        for path in (dead_upload, old_upload, fresh_upload):
            path.write_bytes(b"PK")
        for path in (old, held, old_upload):
            for member in (path, *path.rglob("*")):
                os.utime(member, (hour_ago, hour_ago))
        with open(held / "zip" / "b" / "model.yaml", "rb") as handle:
            holder = subprocess.Popen(["sleep", "60"], stdin=handle)
        try:
            assert remove_interrupted_installs(tmp_path) == 4
        finally:
            holder.kill()
            holder.wait()
        assert sorted(p.name for p in (models / ".staging").iterdir()) == sorted(
            [live.name, "tmpheld", "tmpnew"]
        )
        assert [p.name for p in (models / ".uploads").iterdir()] == ["tmpb.zip"]
        assert remove_interrupted_installs(tmp_path) == 1  # the held one's holder ended


@pytest.mark.parametrize("kind", ["fifo", "character device"])
def test_a_folder_holding_a_device_file_or_fifo_is_refused(
    bundle: Path, tmp_path: Path, kind: str
) -> None:
    """Copying a special file reads it: /dev/zero's node never ends, a FIFO waits for a
    writer. The node made here is /dev/null's (1, 3), so the copy it replaces ends."""
    import stat as stat_module

    special = bundle / "weights.bin"
    if kind == "fifo":
        os.mkfifo(special)
    elif os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    else:
        os.mknod(special, stat_module.S_IFCHR | 0o600, os.makedev(1, 3))
    data = tmp_path / "data"
    with pytest.raises(BundleRejectedError, match=r"weights\.bin, a device file, FIFO or socket"):
        install_bundle(bundle, data, actor="tester", host=HOST)
    assert not (data / "models" / "lesions-test").exists()
