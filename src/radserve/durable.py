"""Write a file atomically and durably: the one definition radserve uses.

A reader (the API, another process, the server after a power cut) must see either the
old file or the whole new one, never half of it. So a file is written to a temporary
name in its own folder, fsynced, renamed over its final name (``os.replace``), and the
folder is fsynced so that the rename itself survives a power cut.

The temporary's name says that it is one and who writes it
(``.<final>.<host>-<pid>-<start>-<nonce>.part``, the start telling the writer from a
later process given its pid, as a restarted container's server is): a process killed
mid-write leaves it behind,
and :func:`sweep` (at server start) deletes exactly those whose process is gone, never
one a live process (another replica on this host, another host on shared storage) is
still writing; a staging folder (:func:`temporary_dir`) is named and swept the same way,
with all it holds. Older versions named their temporaries ``<name>.tmp`` or
``.<name>.<random>.tmp``, which do not say who writes them: :func:`sweep_unowned` deletes
those that no process of this host holds open and nobody has touched for a while.

A job that writes several files into one folder (a SEG per label map, the SR, the key
image Secondary Captures) writes them inside :func:`batch`: each file is still fsynced and
renamed on its own, but the folder is fsynced once, when the block ends, and the block
does not end before that fsync: one folder flush a job instead of one a file (what that
saves depends on the disk: ``tools/durable_cost.py`` times a job both ways).

A folder copied or extracted whole (an installed model bundle, a published result
folder) is staged under another name and moved with :func:`rename_tree`: every file and
folder in it is fsynced before the rename, the folder it lands in after, so a power cut
leaves the final name absent or whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

TEMPORARY_SUFFIX = ".part"
# this host, in the temporary names: a process id means something only on its own host
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_OWNED = re.compile(
    r"\.(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)(?:-(?P<start>[0-9a-f]+))?-[0-9a-f]{32}\.part$"
)
# the temporaries of versions before owned names, and how long one must lie untouched to
# count as left behind: a result file is written in well under a second, and a writer of
# another host (shared storage, an older replica mid-upgrade) cannot be asked
UNOWNED_SUFFIX = ".tmp"
UNOWNED_IDLE_S = 15 * 60.0
# how many removed names a sweep's log line lists (their writers' names: no patient data)
_NAMES_LOGGED = 10
# results hold patient data: only the service user (its API and worker processes) reads them
_FILE_MODE = 0o600
# the folders whose fsync the current batch owes (None: no batch, each write syncs its own)
_OWED: ContextVar[set[Path] | None] = ContextVar("radserve_durable_owed", default=None)


def temporary_path(target: Path, *, pid: int | None = None) -> Path:
    """A new temporary name for ``target``, beside it, owned by ``pid`` (this process),
    named by its :func:`process_tag`."""
    owner = process_tag() if pid is None else _tag_of(pid)
    return target.parent / f".{target.name}.{owner}-{uuid.uuid4().hex}{TEMPORARY_SUFFIX}"


def temporary_dir(parent: Path, stem: str) -> Path:
    """Create a new owned staging folder in ``parent`` (a name :func:`sweep` judges by
    its owner, like a temporary file's) and return it."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    folder = temporary_path(Path(parent) / stem)
    folder.mkdir(mode=0o700)
    return folder


def owner_alive(temporary: Path) -> bool:
    """Whether the writer of ``temporary`` may still be writing it: its owner is a
    running process of this host, or a process of another host (which this one cannot
    see). A name without an owner (written before names had one) has none left."""
    owned = _OWNED.search(temporary.name)
    if owned is None:
        return False
    start = f"-{owned['start']}" if owned["start"] else ""
    return process_alive(f"{owned['host']}-{owned['pid']}{start}")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    except OSError:
        return ""


_BOOT = _boot_id()


def _started(pid: int) -> str | None:
    """When process ``pid`` started: this boot's id and its start time in clock ticks
    since boot (``/proc/<pid>/stat``), None where ``/proc`` does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return f"{_BOOT}{stat[stat.rindex(')') + 2 :].split()[19]}"  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None


def process_tag() -> str:
    """This process as ``<host>-<pid>-<start>``: for a record that must say later whether
    the process that wrote it may still be working on it. The start (:func:`_started`)
    tells this process from a later one given the same pid: a container restarted runs
    its server as the same pid on the same host name, and a record of the server before
    it would otherwise look owned by a live process for ever."""
    global _OWN_TAG
    pid = os.getpid()  # a forked child has its own
    if _OWN_TAG is None or _OWN_TAG[0] != pid:
        _OWN_TAG = (pid, _tag_of(pid))
    return _OWN_TAG[1]


_OWN_TAG: tuple[int, str] | None = None  # read /proc once per process, not once per write


def _tag_of(pid: int) -> str:
    start = _started(pid)
    return f"{_HOST}-{pid}" if start is None else f"{_HOST}-{pid}-{start}"


def of_this_host(tag: str) -> bool:
    """Whether the process a :func:`process_tag` names ran on this host (whose processes
    :func:`process_alive` can see)."""
    return tag.partition("-")[0] == _HOST


def process_alive(tag: str) -> bool:
    """Whether the process a :func:`process_tag` names may still run: a running process
    of this host that started when the tag says (a tag without a start: any with that
    pid), or any of another host (which this one cannot see)."""
    if not of_this_host(tag):
        return True
    pid, _, start = tag.partition("-")[2].partition("-")
    if not pid.isdigit() or not _running(int(pid)):
        return False
    return not start or _started(int(pid)) in (start, None)


def _running(pid: int) -> bool:
    if pid <= 0:  # kill(0 or -n) would ask about a process group, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True


def fsync_dir(path: Path) -> None:
    """Make the names in folder ``path`` (a rename, a new file) durable."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_file(path: Path) -> None:
    """Make the data of the file at ``path`` durable (one a copy or an extract wrote)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """Make every file's data and every folder's names under ``root`` durable, ``root``'s
    own names last: a copied or extracted tree, before it is renamed into place. Links are
    not followed (their names are in their folder)."""
    for path in sorted(Path(root).rglob("*"), reverse=True):  # children before parents
        kind = stat.S_IFMT(path.lstat().st_mode)
        if kind == stat.S_IFDIR:
            fsync_dir(path)
        elif kind == stat.S_IFREG:
            fsync_file(path)
    fsync_dir(root)


def rename_tree(staged: Path, target: Path) -> None:
    """Move folder ``staged`` to the free name ``target`` (same file system) so that after
    a power cut ``target`` is absent or whole: the tree is fsynced, renamed, and
    ``target``'s folder fsynced, in that order, before this returns. Raises what
    :func:`os.rename` raises (``target`` taken: ``EEXIST`` or ``ENOTEMPTY``)."""
    fsync_tree(staged)
    os.rename(staged, target)
    fsync_dir(Path(target).parent)


def make_dirs(path: Path) -> None:
    """Create folder ``path`` and its missing parents, each new name made durable."""
    missing: list[Path] = []
    folder = Path(path)
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        fsync_dir(folder.parent)


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Durable writes in this block leave their folder fsync to the block's end, where each
    folder written into is fsynced once, before the ``with`` statement returns.

    Inside the block a file written by :func:`write_with` is whole under its final name
    (atomic, its data fsynced) but its name is not yet durable: nothing may announce it
    (acknowledge, record, send) before the block ends. Writes on other threads (which do
    not share this context) sync their own folder, as outside a block. An inner block
    leaves its folders to the outer one. When the block raises, the folders are still
    fsynced (what was renamed stays renamed), and a failing fsync there is logged, not
    raised over the block's own error.
    """
    if _OWED.get() is not None:
        yield
        return
    owed: set[Path] = set()
    token = _OWED.set(owed)
    raised = True
    try:
        yield
        raised = False
    finally:
        _OWED.reset(token)
        for folder in sorted(owed):
            try:
                fsync_dir(folder)
            except OSError as exc:
                if not raised:
                    raise
                logger.warning("cannot fsync %s after a failed batch: %s", folder, exc.strerror)


def write_with(
    path: Path,
    write: Callable[[IO[bytes]], None],
    *,
    sync: bool = True,
    mode: int = _FILE_MODE,
) -> Path:
    """Replace ``path`` with what ``write`` writes to the binary handle it is given
    (a file of permissions ``mode``, owner-only by default).

    Inside :func:`batch` the folder fsync is left to the block's end.
    ``sync=False`` keeps the replace atomic but skips both fsyncs: only for a file that
    is rebuilt from durable state anyway after a crash (the job snapshot, rewritten every
    few tens of milliseconds, where two device flushes each time would cost more than
    the file is worth). Anything a client or a restart relies on keeps the default.
    Nothing is left under the temporary name when ``write`` or a step fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    if sync:
        owed = _OWED.get()
        if owed is None:
            fsync_dir(path.parent)
        else:
            owed.add(path.parent)
    return path


def write_bytes(path: Path, data: bytes, *, sync: bool = True, mode: int = _FILE_MODE) -> Path:
    """Replace ``path`` with ``data`` (see :func:`write_with`)."""
    return write_with(path, lambda handle: handle.write(data), sync=sync, mode=mode)


def write_text(
    path: Path, text: str, *, encoding: str = "utf-8", sync: bool = True, mode: int = _FILE_MODE
) -> Path:
    """Replace ``path`` with ``text`` (see :func:`write_with`)."""
    return write_bytes(path, text.encode(encoding), sync=sync, mode=mode)


def write_json(
    path: Path, value: Any, *, sync: bool = True, mode: int = _FILE_MODE, **dumps: Any
) -> Path:
    """Replace ``path`` with ``value`` as UTF-8 JSON (``dumps``: :func:`json.dumps`'s
    options; see :func:`write_with`)."""
    return write_text(path, json.dumps(value, **dumps), sync=sync, mode=mode)


def read_small_json(path: Path, max_bytes: int) -> Any:
    """A small JSON record (as :func:`write_json` writes one) at ``path``, or None when
    there is none. A file anyone may have planted or damaged is read without following
    a link or waiting on a FIFO, and no more than ``max_bytes`` of it: ValueError saying
    why it is unusable, never quoting its content (a decoding error quotes bytes)."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):  # no link, FIFO or device is opened
            raise ValueError("not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise ValueError(f"larger than {max_bytes} bytes")
        return json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(exc.strerror or type(exc).__name__) from None
    except (json.JSONDecodeError, UnicodeError, RecursionError) as exc:
        raise ValueError(f"not UTF-8 JSON ({type(exc).__name__})") from None


def sweep(root: Path, pattern: str = f".*{TEMPORARY_SUFFIX}") -> int:
    """Delete the temporaries under ``root`` matching the glob ``pattern`` whose writer
    died mid-write (see :func:`owner_alive`): nothing under such a name was ever
    acknowledged. Returns how many were deleted."""
    return _remove(root, pattern, lambda temporary: not owner_alive(temporary))


def sweep_unowned(
    root: Path, pattern: str = f"*{UNOWNED_SUFFIX}", *, idle_s: float = UNOWNED_IDLE_S
) -> int:
    """Delete the temporaries of older versions (``*.tmp``, named before temporaries said
    who writes them) under ``root`` matching ``pattern`` whose writer is gone: held open
    by no process of this host and unmodified for ``idle_s`` seconds (a writer of another
    host can only be judged by that). A folder counts as one temporary: nothing in it
    held open or modified. Returns how many were deleted."""
    now = time.time()
    held: set[str] | None = None

    def left_behind(temporary: Path) -> bool:
        nonlocal held
        try:
            members = [temporary, *temporary.rglob("*")] if _is_dir(temporary) else [temporary]
            if any(now - m.lstat().st_mtime < idle_s for m in members):
                return False
        except FileNotFoundError:
            return False
        if held is None:  # read once, and only when a candidate is found
            held = _held_open()
        inside = os.path.realpath(temporary)
        return not any(h == inside or h.startswith(inside + os.sep) for h in held)

    return _remove(root, pattern, left_behind)


def _held_open() -> set[str]:
    """The files the processes of this host hold open (those this user may look into)."""
    held: set[str] = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            entries = os.listdir(fd_dir)
        except OSError:  # another user's process, or one that just ended
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                held.add(os.readlink(fd_dir / entry))
    return held


def _is_dir(path: Path) -> bool:
    return stat.S_ISDIR(path.lstat().st_mode)  # a link to a folder is a file to remove


def _remove(root: Path, pattern: str, stale: Callable[[Path], bool]) -> int:
    """Delete what matches ``pattern`` under ``root`` and ``stale`` judges left behind
    (a staging folder with all it holds); log the names removed."""
    removed: list[str] = []
    for temporary in Path(root).glob(pattern):
        if not stale(temporary):
            continue
        try:
            if _is_dir(temporary):
                shutil.rmtree(temporary)
            else:
                temporary.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:  # a sweep must not stop a start; the next start retries
            logger.warning("cannot remove a stale temporary under %s: %s", root, exc.strerror)
            continue
        removed.append(temporary.relative_to(root).as_posix())
    if removed:
        shown = ", ".join(removed[:_NAMES_LOGGED]) + (", ..." if removed[_NAMES_LOGGED:] else "")
        logger.info(
            "removed %d temporary file(s) or folder(s) of stopped writers under %s: %s",
            len(removed),
            root,
            shown,
        )
    return len(removed)
