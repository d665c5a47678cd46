"""Files radserve builds for an installed version, moved in so that a kill at any point
leaves the version as it was or whole with them, never "changed since install".

An installed version (``<models>/<name>/<version>/`` with ``install.json``) is judged by
its files' SHA-256 against that record: deploy refuses it, and doctor flags it, when they
differ (:func:`radserve.lifecycle.install.verify_install`). ``radserve models
build-variants`` on one writes several files (the variant files, ``model.yaml``'s
``files:`` block, ``gate.json``), minutes apart. Before 2026-12-07 it wrote them into the
version and recorded them last, so a build killed in between left the version "changed
since install" for good: the only way out was to install it again as a new version. Now:

1. **build** in a copy (:func:`stage_version`):
   ``<models>/.staging/.variants-<name>-<version>.<owner>.part/tree/<name>/<version>/``,
   the version's files hard-linked (``install.json`` left out; every write there replaces
   a name, never a linked file's bytes). A kill here leaves the version untouched, and the
   copy is a dead writer's staging folder: the next start or install removes it
   (:func:`recover_commits`, then :func:`radserve.durable.sweep`), saying so;
2. **record** (:meth:`StagedVersion.commit`): the folder, fsynced, is renamed
   ``....commit`` (no sweep takes that name) with its journal (the version, the files to
   move, what, who); then ``install.json`` is replaced whole, fsynced, with the new files'
   SHA-256, an entry under ``changes`` and ``commit``, the folder's name. From here on
   the version *is* the new one, and whoever reads it next finishes the move first;
3. **move** each file in (:func:`finish_commit`: one rename each, variant files first,
   then ``gate.json``, ``model.yaml`` last: a reader in between finds a variant refused by
   its gate's hashes, never one served ungated), then fsync the folder;
4. **close**: ``install.json`` replaced without ``commit``; the folder removed.

A kill between 2 and 4 is finished by the next reader of the version
(:func:`radserve.lifecycle.install.verify_install`: deploy, promote, warm-up, ``radserve
doctor``, the next build) and by the next start, for every version
(:func:`recover_commits`, from :func:`radserve.lifecycle.install.remove_interrupted_installs`),
which logs what it finished; ``radserve doctor`` says it in the version's row. Finishing
is idempotent (a file already moved is not looked for again), so two readers, or a reader
and the build itself, may finish one commit at once.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from radserve import durable
from radserve.models.gate import GATE_FILE, file_sha256

logger = logging.getLogger(__name__)

__all__ = [
    "INSTALL_FILE",
    "STAGING_DIR",
    "StagedVersion",
    "finish_commit",
    "interrupted_build",
    "recover_commits",
    "stage_version",
]

INSTALL_FILE = "install.json"
# under models/: installs being staged, and variant builds of installed versions
STAGING_DIR = ".staging"
_MANIFEST = "model.yaml"
_STEM = "variants"  # a build's staging folder: .variants-<name>-<version>.<owner>.part
_COMMIT_SUFFIX = ".commit"
_JOURNAL = "journal.json"  # in the staging folder: the version, who, and (once 2) what


@dataclass
class StagedVersion:
    """A copy of an installed version to build in (:func:`stage_version`), committed
    into the version with :meth:`commit` or thrown away with :meth:`discard`."""

    directory: Path  # the installed version
    folder: Path  # the staging folder this process owns

    @property
    def root(self) -> Path:
        """A model root holding only the copy: put first among a registry's roots, its
        copy shadows the installed version (the earlier root wins)."""
        return self.folder / "tree"

    @property
    def copy(self) -> Path:
        return self.root / self.directory.parent.name / self.directory.name

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def commit(self, *, what: str) -> list[str]:
        """Move what was written into the copy (files new there, or replaced: another
        inode than the version's, another SHA-256 than ``install.json`` records) into the
        version with its record (steps 2-4 of the module's list); ``what`` is said under
        ``changes``. The names moved, variant files first and ``model.yaml`` last."""
        directory = self.directory
        path = directory / INSTALL_FILE
        data = json.loads(path.read_text())
        written = _written(self.copy, directory, data.get("files", {}))
        if not written:
            self.discard()
            return []
        journal = {**_read_journal(self.folder), "files": list(written), "what": what}
        durable.write_json(self.folder / _JOURNAL, journal, indent=2)
        durable.fsync_tree(self.folder)
        committed = self.folder.with_name(
            self.folder.name.removesuffix(durable.TEMPORARY_SUFFIX) + _COMMIT_SUFFIX
        )
        os.rename(self.folder, committed)
        durable.fsync_dir(committed.parent)
        self.folder = committed
        data["files"] = dict(sorted({**data.get("files", {}), **written}.items()))
        data.setdefault("changes", []).append(
            {
                "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "what": what,
                "files": written,
            }
        )
        data["commit"] = {"folder": committed.name, "files": list(written)}
        try:
            _write_record(path, data)
        except BaseException:
            if _pending_folder(directory) != committed.name:
                self.discard()  # not recorded: the version is as it was
            raise  # else recorded: the next reader finishes it
        finish_commit(directory)
        return list(written)


def stage_version(directory: Path) -> StagedVersion:
    """A copy of the installed version in ``directory`` to build in, in a staging folder
    this process owns beside the other installs' (step 1 of the module's list): every
    file hard-linked (copied where the file system refuses a link), ``install.json`` left
    out, so that the copy is no installed version and the version is not touched."""
    directory = Path(directory)
    name, version = directory.parent.name, directory.name
    folder = durable.temporary_dir(
        directory.parent.parent / STAGING_DIR, f"{_STEM}-{name}-{version}"
    )
    staged = StagedVersion(directory, folder)
    try:
        durable.write_json(
            folder / _JOURNAL,
            {"version": f"{name}/{version}", "owner": durable.process_tag()},
            indent=2,
        )
        shutil.copytree(
            directory,
            staged.copy,
            symlinks=True,
            copy_function=_link_or_copy,
            ignore=lambda where, names: (
                {INSTALL_FILE} if Path(where) == directory and INSTALL_FILE in names else set()
            ),
        )
    except BaseException:
        staged.discard()
        raise
    return staged


def _link_or_copy(source: str, target: str) -> str:
    try:
        os.link(source, target)
    except OSError:  # another file system, or protected_hardlinks and another owner
        shutil.copy2(source, target)
    return target


def _written(copy: Path, directory: Path, recorded: dict[str, str]) -> dict[str, str]:
    """The files of ``copy`` a build wrote, with their SHA-256, in the order they are
    moved in: variant files, then ``gate.json``, then ``model.yaml`` (a linked file
    that is still the version's own is not read)."""
    out: dict[str, str] = {}
    for path in sorted(p for p in copy.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.relative_to(copy).as_posix()
        try:
            if os.path.samestat(path.stat(), (directory / name).stat()):
                continue
        except FileNotFoundError:
            pass
        sha = file_sha256(path)
        if recorded.get(name) != sha or not (directory / name).is_file():
            out[name] = sha
    last = {GATE_FILE: 1, _MANIFEST: 2}
    return dict(sorted(out.items(), key=lambda item: (last.get(item[0], 0), item[0])))


def _write_record(path: Path, data: dict[str, Any]) -> None:
    """Replace ``install.json`` whole, fsynced, keeping its permissions. The new file is
    written in the models root's staging folder, not beside it: a kill mid-write leaves
    its temporary where the next start sweeps it, not in the version (where it read as a
    file "added after install")."""
    staging = path.parent.parent.parent / STAGING_DIR
    staging.mkdir(exist_ok=True)
    temporary = durable.temporary_path(staging / INSTALL_FILE)
    try:
        descriptor = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(path.stat().st_mode)
        )
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data, indent=2))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    durable.fsync_dir(path.parent)


def _read_journal(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / _JOURNAL).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _safe(name: object) -> bool:
    """A file name a commit may move: relative, inside the version."""
    if not isinstance(name, str) or not name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts and name != INSTALL_FILE


def finish_commit(directory: Path) -> str | None:
    """Finish the commit ``install.json`` of ``directory`` names, if any (steps 3-4 of
    the module's list); what was done, in a sentence for the log and doctor, or None
    when nothing was pending.

    Raises:
        OSError: the version or its staging folder cannot be written (another user's).
    """
    directory = Path(directory)
    path = directory / INSTALL_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    pending = data.get("commit") if isinstance(data, dict) else None
    if not isinstance(pending, dict):
        return None
    name = pending.get("folder")
    if not (isinstance(name, str) and name.endswith(_COMMIT_SUFFIX) and "/" not in name):
        name = f"(unreadable){_COMMIT_SUFFIX}"  # nothing to move from; said below
    folder = directory.parent.parent / STAGING_DIR / name
    copy = folder / "tree" / directory.parent.name / directory.name
    names = [n for n in pending.get("files", []) if _safe(n)]
    lost = []
    for name in names:
        target = directory / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(copy / name, target)
        except FileNotFoundError:  # moved already: by this commit before a kill, or a reader
            if not target.is_file():
                lost.append(name)
    for parent in sorted({(directory / n).parent for n in names}):
        durable.fsync_dir(parent)
    data.pop("commit", None)
    _write_record(path, data)
    shutil.rmtree(folder, ignore_errors=True)
    what = (data.get("changes") or [{}])[-1].get("what", "a change radserve made")
    key = f"{directory.parent.name}/{directory.name}"
    if lost:
        return (
            f"{key}: the change {what!r} was cut short while its files were moved in, and "
            f"{', '.join(lost)} can no longer be moved ({folder.name} is gone): the version "
            "reads changed since install; install the bundle again as a new version"
        )
    return (
        f"{key}: the change {what!r} was cut short while its files were moved in; "
        f"finished: the version is whole with them ({', '.join(names)})"
    )


def interrupted_build(directory: Path) -> str | None:
    """What a variant build of ``directory`` killed before it recorded its files left
    (its staging folder, whose writer is gone; the next start removes it): a sentence
    saying that the version is as it was, or None."""
    directory = Path(directory)
    key = f"{directory.parent.name}/{directory.name}"
    for folder in _build_folders(directory.parent.parent):
        journal = _read_journal(folder)
        if journal.get("version") != key or _owner_alive(folder, journal):
            continue
        if folder.name == _pending_folder(directory):
            continue  # recorded: finish_commit's to finish
        if folder.name.endswith(_COMMIT_SUFFIX) and not _unmoved(folder, journal):
            continue  # all moved in and recorded; only the folder was left
        return (
            f"a variant build of {key} was killed before it recorded its files "
            f"(left {folder.name}, removed at the next start): the version is as it was"
        )
    return None


def _build_folders(models_root: Path) -> list[Path]:
    staging = Path(models_root) / STAGING_DIR
    if not staging.is_dir():
        return []
    return sorted(
        p
        for suffix in (durable.TEMPORARY_SUFFIX, _COMMIT_SUFFIX)
        for p in staging.glob(f".{_STEM}-*{suffix}")
        if p.is_dir()
    )


def _owner_alive(folder: Path, journal: dict[str, Any]) -> bool:
    """Whether the build that owns ``folder`` may still run: a staging folder's name
    says (:func:`radserve.durable.owner_alive`, also before its journal is written), a
    commit folder's journal."""
    if folder.name.endswith(durable.TEMPORARY_SUFFIX):
        return durable.owner_alive(folder)
    owner = journal.get("owner")
    return isinstance(owner, str) and durable.process_alive(owner)


def recover_commits(models_root: Path) -> list[str]:
    """At a start: finish every variant build's commit that a kill interrupted after it
    was recorded, and remove the staging folders of builds killed before (their versions
    are as they were); each logged, and returned, in a sentence. A build whose process
    still runs is left to it."""
    notes: list[str] = []
    root = Path(models_root)
    for folder in _build_folders(root):
        journal = _read_journal(folder)
        key = journal.get("version")
        directory = root / key if isinstance(key, str) and _safe(key) else None
        record = _pending_folder(directory) if directory is not None else None
        try:
            if directory is not None and record == folder.name:
                note = finish_commit(directory)
                if note:
                    logger.warning("%s", note)
                    notes.append(note)
                continue
            if _owner_alive(folder, journal):
                continue
            # a commit folder all of whose files were moved in: a kill after step 4's
            # record, before the folder went; nothing to say of the version
            finished = folder.name.endswith(_COMMIT_SUFFIX) and not _unmoved(folder, journal)
            shutil.rmtree(folder)
        except OSError as exc:  # a start goes on; the next one tries again
            logger.warning("cannot recover the variant build in %s: %s", folder, exc.strerror)
            continue
        if finished:
            continue
        note = (
            f"{key or folder.name}: a variant build was killed before it recorded its "
            f"files; the version is as it was (its copy {folder.name} is removed)"
        )
        logger.warning("%s", note)
        notes.append(note)
    return notes


def _pending_folder(directory: Path) -> str | None:
    try:
        data = json.loads((directory / INSTALL_FILE).read_text())
    except (OSError, ValueError):
        return None
    pending = data.get("commit") if isinstance(data, dict) else None
    return str(pending.get("folder")) if isinstance(pending, dict) else None


def _unmoved(folder: Path, journal: dict[str, Any]) -> bool:
    """Whether the commit folder of ``journal`` still holds a file to move in."""
    key = str(journal.get("version", ""))
    return any(
        (folder / "tree" / key / name).is_file()
        for name in journal.get("files", [])
        if _safe(name) and _safe(key)
    )
