"""Install a model bundle (a folder or a zip of one) into the data dir's model store.

What install checks, in order, refusing with every reason it found:

1. the archive (zip): member count and central directory size (read from its end
   record, before anything parses the directory), total and per-member size counted as
   bytes are written (never trusted from the header), compression ratio, no absolute
   path, no ``..``, no control character in a name, no link, no device file;
2. exactly one ``model.yaml`` in the bundle, at most :data:`MAX_BUNDLE_DEPTH` folders
   down (a deeper one is named), valid (:func:`load_manifest`);
3. every file ``files:`` names exists inside the bundle and its ONNX graph (read with
   ``load_external_data=False``: nothing outside the bundle is opened) has one input and
   an output whose rank, channel count and element type match the manifest, and gives
   an output of the input's grid on a probe batch shaped as the pipeline feeds it
   (:func:`radserve.lifecycle.graph_checks.check_onnx`);
4. ``requires:`` against this host, and each graph's opsets and IR version against what
   this host's ONNX Runtime loads (:mod:`radserve.lifecycle.requirements`);
5. the name and version is not installed already (a version is never overwritten).

A ``gate.json`` inside the bundle is not trusted (since 2026-12-06): it was measured
elsewhere, on a vendor's data and CPU, not on this site's held-out phantoms, and the
registry served reduced-precision variants on it. Unless the installer vouches for it
(``trust_shipped_gate``: a gate this site built with ``radserve models build-variants``
before installing), it is set aside as ``gate.shipped.json`` before anything else, so
no variant serves until it is gated here.

An optional ``prepare`` step (``install --build-variants``: precision variants built
and gated into the bundle) runs on the staged copy after these checks and before the
hashes are taken, so the variants and their ``gate.json`` are part of what was
installed; the ONNX checks run again on what it declared.

The bundle is then copied by content (a file hard-linked to one outside the bundle is
read, never linked: the store holds its own inode) to
``<data_dir>/models/<name>/<version>/`` (atomic rename from
a staging folder on the same file system, every file and folder fsynced before it and
the parent folder after: :func:`radserve.durable.rename_tree`) with ``install.json``: the
SHA-256 of every file, when, from where and by whom. :func:`verify_install` recomputes
those hashes.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import logging
import lzma
import os
import shutil
import stat
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from radserve import durable
from radserve.errors import BundleExistsError, BundleRejectedError, ModelError
from radserve.lifecycle.graph_checks import check_onnx
from radserve.lifecycle.requirements import HostFacts, host_facts, unmet_requirements
from radserve.lifecycle.version_commit import (
    INSTALL_FILE,
    STAGING_DIR,
    finish_commit,
    recover_commits,
)
from radserve.models.bf16 import ServingProviders
from radserve.models.gate import GATE_FILE, SHIPPED_GATE_FILE, GateReport
from radserve.models.manifest import ModelSpec, load_manifest
from radserve.models.registry import ModelRegistry, bundled_model_dir
from radserve.validation_text import problem_message
from radserve.zip_members import ENCRYPTED, unreadable_member, zip_directory

logger = logging.getLogger(__name__)

MODELS_SUBDIR = "models"
# under models/: installs being staged (STAGING_DIR, with variant builds of installed
# versions: radserve.lifecycle.version_commit), and bundle zips uploaded to the API
UPLOADS_DIR = ".uploads"
MANIFEST = "model.yaml"
MAX_BUNDLE_DEPTH = 3
"""Folders between what was given (a folder, or a zip's top) and the one holding
``model.yaml``; the search looks one folder deeper only to name a model.yaml too deep."""
UPLOADED = "the uploaded zip"  # how a refusal names a bundle sent to POST /v1/models


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on a zip offered for install (a hostile zip is refused, not extracted)."""

    max_members: int = 256
    max_total_bytes: int = 8 * 1024**3
    max_member_bytes: int = 4 * 1024**3
    max_ratio: float = 200.0  # uncompressed / compressed, per member
    # the central directory's bytes, from the end record: zipfile reads and parses them
    # whatever entry count the record gives (~600 bytes of Python objects per entry)
    max_directory_bytes: int = 2 * 1024**2


@dataclass(frozen=True)
class InstalledBundle:
    """What was installed (the content of ``install.json``)."""

    name: str
    version: str
    directory: Path
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    installed_at: str = ""
    source: str = ""
    actor: str | None = None
    # a gate.json that came in the bundle: "set_aside" (untrusted, gate.shipped.json) or
    # "trusted" (the installer vouched for it); None: the bundle had none
    shipped_gate: str | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "files": dict(self.files),
            "installed_at": self.installed_at,
            "source": self.source,
            "actor": self.actor,
            "shipped_gate": self.shipped_gate,
        }


def models_root(data_dir: Path) -> Path:
    """Where installed bundles live: ``<data_dir>/models``."""
    return Path(data_dir) / MODELS_SUBDIR


def site_registry(
    model_dirs: Sequence[Path], data_dir: Path, *, serving: ServingProviders | None = None
) -> ModelRegistry:
    """The bundles a server with these settings serves, in the order they are searched:
    the site's ``models.dirs``, the installed ones (:func:`models_root`, which may not
    exist yet) and the shipped ones. ``radserve serve``, ``doctor`` and ``run`` read the
    same (before session 42 ``run --config`` did not see what ``models install`` had
    installed into that config's data dir: "unknown model")."""
    installed = models_root(data_dir)
    return ModelRegistry(
        [*model_dirs, installed, bundled_model_dir()], missing_ok=[installed], serving=serving
    )


def upload_path(data_dir: Path) -> Path:
    """A new name for an uploaded bundle zip, owned by this process (see
    :func:`remove_interrupted_installs`); its folder is created."""
    uploads = models_root(data_dir) / UPLOADS_DIR
    uploads.mkdir(parents=True, exist_ok=True)
    return durable.temporary_path(uploads / "bundle.zip")


def remove_interrupted_installs(data_dir: Path) -> int:
    """Delete the staging folders and uploaded zips that installs killed mid-way left
    (nothing else removes them); call at server start and at a CLI install's start.
    First, variant builds of installed versions that a kill cut short are finished or
    removed, each logged (:func:`radserve.lifecycle.version_commit.recover_commits`).

    Their names say which process owns them (:func:`radserve.durable.temporary_path`):
    one whose owner still runs on this host (the server's install beside a CLI one, or
    the other way round) is kept. Those of versions before owned names (``tmp*``) go
    once nothing in them is held open or changed for a while
    (:func:`radserve.durable.sweep_unowned`). Returns how many were deleted."""
    root = models_root(data_dir)
    removed = 0
    recover_commits(root)
    for folder, unowned in ((STAGING_DIR, "tmp*"), (UPLOADS_DIR, "tmp*.zip")):
        if (root / folder).is_dir():
            removed += durable.sweep(root / folder) + durable.sweep_unowned(root / folder, unowned)
    return removed


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- archive -------------------------------------------------------------------------------
_CONTROL = frozenset({"Cc", "Cf", "Zl", "Zp"})  # control, invisible format, line breaks


def _safe_member(name: str) -> PurePosixPath:
    if not name:  # zipfile's ZipInfo.is_dir() raises IndexError on it
        raise BundleRejectedError("the archive has a member with an empty name")
    if any(unicodedata.category(char) in _CONTROL for char in name):
        raise BundleRejectedError(
            f"archive member {name[:200]!r} has a control character in its name; rename it"
        )
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise BundleRejectedError(f"archive member {name[:200]!r} points outside the bundle")
    return path


def _check_directory(archive: Path, limits: ArchiveLimits, shown: str) -> None:
    """Refuse a zip whose end record lists more than ``limits.max_members`` entries or a
    central directory larger than ``limits.max_directory_bytes``, before zipfile parses
    it: before 2026-12-07 the count was checked on what zipfile had parsed, and a 103 MB
    zip of 1.2 million empty entries took the server from 286 MB to 911 MB first."""
    try:
        with open(archive, "rb") as stream:
            listed = zip_directory(stream)
    except OSError as exc:
        raise BundleRejectedError(f"{shown} is not a readable zip: {exc.strerror or exc}") from exc
    if listed is None:
        return  # no end record: zipfile says what is wrong
    entries, directory = listed
    if entries > limits.max_members:
        raise BundleRejectedError(f"{shown} holds {entries} entries; at most {limits.max_members}")
    if directory > limits.max_directory_bytes:
        raise BundleRejectedError(
            f"{shown} has a central directory of {directory} bytes; at most "
            f"{limits.max_directory_bytes} (at most {limits.max_members} entries)"
        )


def extract_zip(
    archive: Path,
    target: Path,
    limits: ArchiveLimits = ArchiveLimits(),
    *,
    shown: str | None = None,
) -> None:
    """Extract ``archive`` into ``target`` within ``limits``; refuse anything unsafe.
    ``shown``: how refusals name the archive (default: its path)."""
    shown = shown or str(archive)
    _check_directory(archive, limits, shown)
    try:
        zf = zipfile.ZipFile(archive)
    except _ZIP_ERRORS as exc:  # a member name not in its declared encoding: ValueError
        raise BundleRejectedError(f"{shown} is not a readable zip: {_reason(exc)}") from exc
    with zf:
        members = zf.infolist()
        if len(members) > limits.max_members:  # the end record understated them
            raise BundleRejectedError(
                f"{shown} holds {len(members)} entries; at most {limits.max_members}"
            )
        total = 0
        for info in members:
            rel = _safe_member(info.filename)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type recorded
            if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                raise BundleRejectedError(
                    f"archive member {info.filename!r} is a link or special file"
                )
            dest = target.joinpath(*rel.parts)
            if info.is_dir():
                _member_folder(dest, info, shown)
                continue
            if not rel.parts:
                raise BundleRejectedError(f"archive member {info.filename!r} has no file name")
            unreadable = _unreadable_member(info)
            if unreadable:
                raise BundleRejectedError(f"archive member {info.filename[:200]!r} {unreadable}")
            if info.file_size > limits.max_member_bytes:
                raise BundleRejectedError(f"archive member {info.filename!r} is too large")
            _member_folder(dest.parent, info, shown)
            written = 0
            try:
                with zf.open(info) as src, open(dest, "xb") as out:
                    for chunk in iter(lambda src=src: src.read(1 << 20), b""):
                        written += len(chunk)
                        total += len(chunk)
                        if written > limits.max_member_bytes or total > limits.max_total_bytes:
                            raise BundleRejectedError(
                                f"{shown} expands beyond {limits.max_total_bytes} bytes"
                            )
                        if written > max(info.compress_size, 1) * limits.max_ratio + (1 << 20):
                            raise BundleRejectedError(
                                f"archive member {info.filename!r} expands more than "
                                f"{limits.max_ratio:g}x (a zip bomb?)"
                            )
                        out.write(chunk)
            except FileExistsError as exc:
                raise BundleRejectedError(
                    f"archive member {info.filename!r} appears twice"
                ) from exc
            except BundleRejectedError:
                raise
            except _ZIP_ERRORS as exc:  # damaged compressed data: zlib.error, LZMAError
                raise BundleRejectedError(
                    f"{shown}: cannot extract {info.filename[:200]!r}: {_reason(exc)}"
                ) from exc


# What zipfile raises on a hostile or damaged archive, besides BadZipFile and OSError:
# before 2026-12-08 each of these ended an install in a traceback (HTTP 500 for
# ``POST /v1/models``): a ZIP64 locator claiming several disks or a member name not in its
# declared encoding (ValueError) when the directory is read, an encrypted member
# (RuntimeError), a compression method zipfile lacks such as Deflate64 (NotImplementedError),
# damaged Deflate or LZMA data (zlib.error, LZMAError) as a member is inflated.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    zlib.error,
    lzma.LZMAError,
)


def _reason(exc: BaseException) -> str:
    """What went wrong reading an archive, in one line."""
    return str(getattr(exc, "strerror", None) or exc or type(exc).__name__)


def _unreadable_member(info: zipfile.ZipInfo) -> str | None:
    """Why a member cannot be read at all (:func:`radserve.zip_members.unreadable_member`),
    said before it is opened; None for one that can."""
    unreadable = unreadable_member(info)
    if unreadable == ENCRYPTED:
        return "is encrypted; zip the bundle without a password"
    if unreadable:
        return f"cannot be read: {unreadable}; zip the bundle with Deflate"
    return None


def is_zip(path: Path) -> bool:
    """Whether ``path`` is a zip archive by its end record (:func:`zipfile.is_zipfile`),
    counting as one an archive that record marks as damaged (a ZIP64 locator claiming
    several disks, which ``is_zipfile`` raises on): :func:`extract_zip` then refuses it
    saying what is wrong."""
    try:
        return zipfile.is_zipfile(path)
    except zipfile.BadZipFile:
        return True


def _member_folder(folder: Path, info: zipfile.ZipInfo, shown: str) -> None:
    """Create the folder a zip member goes in (or is): a name that is a file in one
    member and a folder in another, or a path the file system cannot hold (too long,
    too deep), is refused by name; before 2026-12-06 both ended in a traceback (an HTTP
    500) naming radserve's staging folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise BundleRejectedError(
            f"archive member {info.filename[:200]!r} needs a folder where another member is a file"
        ) from exc
    except OSError as exc:
        raise BundleRejectedError(
            f"{shown}: cannot extract {info.filename[:200]!r}: {exc.strerror or exc}"
        ) from exc


def _refuse_special_files(folder: Path) -> None:
    """Refuse a bundle folder holding a device file, FIFO or socket: copying one reads
    it (a character device like /dev/zero never ends; a FIFO waits for a writer)."""
    for path in folder.rglob("*"):
        kind = stat.S_IFMT(path.lstat().st_mode)
        if kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
            raise BundleRejectedError(
                f"the bundle folder holds {path.relative_to(folder)}, a device file, FIFO "
                "or socket; copy real files"
            )


def _bundle_dir(root: Path, shown: str) -> Path:
    """The one folder under ``root`` (itself, or up to :data:`MAX_BUNDLE_DEPTH` folders
    down) holding model.yaml. The walk goes no deeper than one folder past the limit, to
    name a model.yaml found too deep (before 2026-12-07 it walked the whole tree given,
    ``radserve models install /work`` included, and said "holds no model.yaml" of one
    too deep); links to folders are not followed. ``shown``: how ``root`` is named."""
    found: list[PurePosixPath] = []
    level = [PurePosixPath()]
    for depth in range(MAX_BUNDLE_DEPTH + 2):
        if found and depth > MAX_BUNDLE_DEPTH:
            break
        deeper: list[PurePosixPath] = []
        for rel in level:
            try:
                with os.scandir(root.joinpath(*rel.parts)) as entries:
                    names = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in entries)
            except OSError:  # unreadable: as rglob did, looked past
                continue
            found += [rel / MANIFEST for name, _ in names if name == MANIFEST]
            deeper += [rel / name for name, is_dir in names if is_dir]
        level = deeper
    if not found:
        raise BundleRejectedError(
            f"{shown} holds no model.yaml in its top folder or up to {MAX_BUNDLE_DEPTH} "
            "folders below it"
        )
    if len(found[0].parts) > MAX_BUNDLE_DEPTH + 1:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise BundleRejectedError(
            f"model.yaml found at {_shown_path(found[0])}{more}, deeper than "
            f"{MAX_BUNDLE_DEPTH} folders in {shown}: give the folder that holds model.yaml "
            "(or a zip of it)"
        )
    if len(found) > 1:
        names = ", ".join(_shown_path(p.parent) for p in found)
        raise BundleRejectedError(f"the bundle holds several model.yaml ({names}); give one")
    return root.joinpath(*found[0].parent.parts)


def _shown_path(rel: PurePosixPath) -> str:
    """A path found in a bundle as a message shows it: escaped when a name in it holds
    characters that are not printable (a newline, a terminal escape)."""
    text = rel.as_posix()
    return text if text.isprintable() else repr(text)


def _shown_source(source: Path, root: Path, described_as: str | None) -> str:
    """How a refusal names what was offered: "the uploaded zip" for a body sent to
    ``POST /v1/models`` (its upload file's name says nothing to the sender), else
    ``described_as``, else the path as given (the CLI's argument)."""
    try:
        uploaded = source.parent.resolve() == (root / UPLOADS_DIR).resolve()
    except OSError:
        uploaded = False
    return UPLOADED if uploaded else described_as or str(source)


# --- install -----------------------------------------------------------------------------------
def inspect_bundle(
    directory: Path, host: HostFacts | None = None, *, providers: Sequence[str] = ()
) -> tuple[ModelSpec, list[str]]:
    """The manifest of the bundle in ``directory`` and every reason to refuse it; its
    probe batches run on ``providers`` (the server's; empty: the host's choice), and its
    ``requires:`` is checked against them (a required provider the host has but the
    server does not serve with is unmet, since 2026-12-07)."""
    try:
        # named as the bundle holds it: the path is the staging copy's, which is gone
        # by the time the refusal is read
        spec = load_manifest(directory / MANIFEST, shown="model.yaml (in the bundle)")
    except ModelError as exc:
        raise BundleRejectedError(exc.message) from exc
    reasons = check_onnx(spec, directory, providers=providers)
    reasons += unmet_requirements(spec, host or host_facts(), providers=providers)
    return spec, reasons


def hash_tree(directory: Path) -> dict[str, str]:
    """sha256 of every regular file under ``directory`` (install.json excluded)."""
    out: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            raise BundleRejectedError(f"{path.relative_to(directory)} is a link")
        if path.is_file() and path.name != INSTALL_FILE:
            out[path.relative_to(directory).as_posix()] = sha256_file(path)
    return out


@dataclass
class StagedBundle:
    """A bundle that passed every check, copied into a staging folder owned by this
    process, not yet installed (:func:`finish_install` installs it, or :meth:`discard`)."""

    staging: Path
    copy: Path
    spec: ModelSpec
    target: Path
    source_name: str

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def stage_bundle(
    source: Path,
    data_dir: Path,
    *,
    host: HostFacts | None = None,
    limits: ArchiveLimits = ArchiveLimits(),
    existing: set[tuple[str, str]] | None = None,
    described_as: str | None = None,
    providers: Sequence[str] = (),
) -> StagedBundle:
    """Checks 1-5 of the module's list on a staged copy of ``source`` (a bundle folder or
    zip), so that a bundle refused is refused before any long ``prepare`` step starts.
    ``described_as``: what ``install.json`` records as the source (default: its name; an
    upload's temporary file name says nothing).

    ``existing``: (name, version) pairs served from elsewhere (the shipped models): also
    refused, so one name and version always means one set of files. ``providers``: the
    execution providers the server serves with, which the probe batches run on.

    Raises:
        BundleRejectedError: every reason the bundle may not be installed.
        BundleExistsError: the name and version is installed already.
    """
    source = Path(source)
    root = models_root(data_dir)
    shown = _shown_source(source, root, described_as)
    staging = durable.temporary_dir(root / STAGING_DIR, "install")
    try:
        if source.is_dir():
            bundle = _bundle_dir(source, shown)
            _refuse_special_files(bundle)
            copy = staging / "bundle"
            shutil.copytree(bundle, copy, symlinks=True)
            if any(p.is_symlink() for p in copy.rglob("*")):
                raise BundleRejectedError("the bundle folder contains links; copy real files")
        elif source.is_file() and is_zip(source):
            extract_zip(source, staging / "zip", limits, shown=shown)
            copy = _bundle_dir(staging / "zip", shown)
        else:
            raise BundleRejectedError(f"{source} is neither a bundle folder nor a zip of one")
        spec, reasons = inspect_bundle(copy, host, providers=providers)
        if reasons:
            raise BundleRejectedError(f"{spec.key} cannot be installed: " + "; ".join(reasons))
        target = root / spec.name / spec.version
        if target.exists() or (spec.name, spec.version) in (existing or set()):
            raise BundleExistsError(
                f"{spec.key} is installed already; a version is never replaced: give the "
                "new files a new version in model.yaml"
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return StagedBundle(staging, copy, spec, target, described_as or source.name)


def finish_install(
    staged: StagedBundle,
    *,
    actor: str | None = None,
    host: HostFacts | None = None,
    prepare: Callable[[Path, ModelSpec], None] | None = None,
    before_commit: Callable[[InstalledBundle, Path], None] | None = None,
    trust_shipped_gate: bool = False,
    providers: Sequence[str] = (),
) -> InstalledBundle:
    """Install a staged bundle; its staging folder is removed whatever happens.

    A ``gate.json`` in the bundle is set aside as ``gate.shipped.json`` first (before
    ``prepare``, which would keep its records of variants it does not rebuild), unless
    ``trust_shipped_gate``: the installer vouches that this site built it.

    ``prepare(root, spec)``: called with a model root holding only the staged bundle
    (``root/<name>/<version>``); what it adds is installed, after the ONNX checks ran
    again on what it declared (probe batches on ``providers``, as :func:`stage_bundle`).

    ``before_commit(record, folder)``: called once the bundle is checked and hashed,
    before the version appears in the store (``folder``: what will be installed). The
    server writes the install's audit record here, so that no version is installed
    unaudited: an exception raised by it installs nothing.

    Raises:
        BundleRejectedError: what ``prepare`` built is unusable (or ``prepare``'s own).
        BundleExistsError: the version was installed while this one was prepared.
    """
    try:
        spec, copy, target = staged.spec, staged.copy, staged.target
        # one that came in the bundle is replaced below; ``prepare`` must not take the
        # copy for an installed version (radserve.variants records its files in one)
        (copy / INSTALL_FILE).unlink(missing_ok=True)
        shipped_gate = None
        if (copy / GATE_FILE).is_file():
            shipped_gate = "trusted" if trust_shipped_gate else "set_aside"
            if not trust_shipped_gate:
                os.replace(copy / GATE_FILE, copy / SHIPPED_GATE_FILE)
            else:
                _refuse_unreadable_gate(copy, spec)
        if prepare is not None:
            tree = staged.staging / "tree"
            prepared = tree / spec.name / spec.version
            prepared.parent.mkdir(parents=True)
            os.rename(copy, prepared)
            copy = prepared
            prepare(tree, spec)
            spec, reasons = inspect_bundle(copy, host, providers=providers)
            if reasons:
                raise BundleRejectedError(
                    f"{spec.key}: what was built at install is unusable: " + "; ".join(reasons)
                )
        record = InstalledBundle(
            name=spec.name,
            version=spec.version,
            directory=target,
            files=hash_tree(copy),
            installed_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            source=staged.source_name,
            actor=actor,
            shipped_gate=shipped_gate,
        )
        (copy / INSTALL_FILE).write_text(json.dumps(record.as_json(), indent=2))
        if before_commit is not None:
            before_commit(record, copy)
        durable.make_dirs(target.parent)
        try:  # what "installed" announces survives a power cut, whole
            durable.rename_tree(copy, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise BundleExistsError(f"{spec.key} is installed already") from exc
            raise
        return record
    finally:
        staged.discard()


def _refuse_unreadable_gate(copy: Path, spec: ModelSpec) -> None:
    """Refuse a bundle whose gate.json, trusted by its installer, radserve cannot read:
    before 2026-12-07 it was installed, then its install answered 503 ``model_invalid``
    (the CLI an error) when the answer read the gate, and sending it again was refused
    as installed already."""
    try:
        GateReport.model_validate_json((copy / GATE_FILE).read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        raise BundleRejectedError(
            f"{spec.key}: its gate.json, trusted at install, is not a gate report radserve "
            f"reads ({exc.error_count()} problem(s); {where}: {problem_message(first)}): gate the "
            "bundle with `radserve models build-variants`, or install it without trusting "
            "its gate"
        ) from exc


def install_bundle(
    source: Path,
    data_dir: Path,
    *,
    actor: str | None = None,
    host: HostFacts | None = None,
    limits: ArchiveLimits = ArchiveLimits(),
    existing: set[tuple[str, str]] | None = None,
    prepare: Callable[[Path, ModelSpec], None] | None = None,
    trust_shipped_gate: bool = False,
    providers: Sequence[str] = (),
) -> InstalledBundle:
    """Validate ``source`` (a bundle folder or zip) and copy it into the model store
    (:func:`stage_bundle`, then :func:`finish_install`)."""
    staged = stage_bundle(
        source, data_dir, host=host, limits=limits, existing=existing, providers=providers
    )
    return finish_install(
        staged,
        actor=actor,
        host=host,
        prepare=prepare,
        trust_shipped_gate=trust_shipped_gate,
        providers=providers,
    )


def read_install(directory: Path) -> InstalledBundle | None:
    """The bundle's ``install.json`` (None for a bundle that was not installed)."""
    path = Path(directory) / INSTALL_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return InstalledBundle(
        name=data["name"],
        version=data["version"],
        directory=Path(directory),
        files=dict(data.get("files", {})),
        installed_at=data.get("installed_at", ""),
        source=data.get("source", ""),
        actor=data.get("actor"),
        shipped_gate=data.get("shipped_gate"),
    )


def verify_install(directory: Path) -> list[str]:
    """Files of an installed bundle that changed, vanished or appeared since install.

    A change radserve recorded and was moving in when it was killed (``radserve models
    build-variants`` on the version) is finished first, and logged
    (:func:`radserve.lifecycle.version_commit.finish_commit`): the version is judged whole
    with it, as recorded. One that cannot be finished here (a user who may not write the
    version) is a reason of its own."""
    try:
        note = finish_commit(directory)
    except OSError as exc:
        return [
            f"a change recorded in {INSTALL_FILE} was cut short while its files were moved "
            f"in, and cannot be finished by this user ({exc.strerror}): start the server, "
            "or run radserve doctor as its user"
        ]
    if note:
        logger.warning("%s", note)
    record = read_install(directory)
    if record is None:
        return []
    now = hash_tree(Path(directory))
    problems = [
        f"{name} changed since install"
        for name, sha in record.files.items()
        if name in now and now[name] != sha
    ]
    problems += [f"{name} is missing" for name in record.files if name not in now]
    problems += [f"{name} was added after install" for name in now if name not in record.files]
    return problems


__all__ = [
    "INSTALL_FILE",
    "MAX_BUNDLE_DEPTH",
    "ArchiveLimits",
    "InstalledBundle",
    "check_onnx",
    "extract_zip",
    "hash_tree",
    "inspect_bundle",
    "install_bundle",
    "is_zip",
    "models_root",
    "read_install",
    "remove_interrupted_installs",
    "upload_path",
    "verify_install",
]
