"""Received instances on disk, durable before the C-STORE success status goes out.

Layout under the SCP's data folder::

    incoming/<Study Instance UID>/<SOP Instance UID>.dcm    images, handed to intake
    quarantine/<Study Instance UID>/<SOP Instance UID>.dcm  other storage classes, kept aside

Folder and file names are UIDs checked to be digits and dots, so nothing a sender typed
(a patient name) ends up in a path. Each file is written to a private temporary name,
fsynced, then linked to its final name (a link fails if the name exists, so of two
concurrent copies of one instance exactly one is kept) and the folder is fsynced.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from radserve.gateway.errors import InstanceRejectedError, OutOfResourcesError

logger = logging.getLogger(__name__)

INCOMING_DIR = "incoming"
QUARANTINE_DIR = "quarantine"
INSTANCE_SUFFIX = ".dcm"
_UID = re.compile(r"^[0-9]+(\.[0-9]+)*$")


class Disposition(StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"  # same SOP Instance UID already on disk: kept as it was
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class StoredInstance:
    study_instance_uid: str
    sop_instance_uid: str
    sop_class_uid: str
    path: Path
    disposition: Disposition


def check_uid(value: object, what: str) -> str:
    """A UID safe to use as a file name; :class:`InstanceRejectedError` otherwise."""
    uid = str(value or "").strip().rstrip("\x00")
    if not uid or len(uid) > 64 or not _UID.match(uid):
        raise InstanceRejectedError(f"{what} missing or not a valid UID")
    return uid


class InstanceStore:
    """Writes received instances; thread-safe (one call per C-STORE, many associations)."""

    def __init__(self, root: Path, *, min_free_bytes: int = 0) -> None:
        self.root = Path(root)
        self.incoming = self.root / INCOMING_DIR
        self.quarantine = self.root / QUARANTINE_DIR
        self.min_free_bytes = min_free_bytes
        for folder in (self.incoming, self.quarantine):
            folder.mkdir(parents=True, exist_ok=True)

    def study_dir(self, study_instance_uid: str, *, quarantine: bool = False) -> Path:
        base = self.quarantine if quarantine else self.incoming
        return base / check_uid(study_instance_uid, "Study Instance UID")

    def save(
        self,
        encoded: bytes,
        *,
        study_instance_uid: str,
        sop_instance_uid: str,
        sop_class_uid: str,
        quarantine: bool = False,
    ) -> StoredInstance:
        """Make ``encoded`` (a DICOM file: preamble, meta, dataset) durable.

        Raises :class:`OutOfResourcesError` when it cannot (disk full, I/O error): the
        caller must then answer a failure, never success.
        """
        folder = self.study_dir(study_instance_uid, quarantine=quarantine)
        sop_uid = check_uid(sop_instance_uid, "SOP Instance UID")
        target = folder / f"{sop_uid}{INSTANCE_SUFFIX}"
        stored = StoredInstance(
            study_instance_uid=folder.name,
            sop_instance_uid=sop_uid,
            sop_class_uid=sop_class_uid,
            path=target,
            disposition=Disposition.QUARANTINED if quarantine else Disposition.STORED,
        )
        if target.exists():
            return _duplicate(stored)
        try:
            self._check_space(len(encoded))
            self._make_folder(folder)
            if not _write_new(folder, target, encoded):
                return _duplicate(stored)
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            logger.error("instance %s not stored: %s", sop_uid, reason)
            raise OutOfResourcesError(f"cannot store the instance: {reason}") from exc
        return stored

    def remove_partials(self) -> int:
        """Delete temporary files a crash left mid-write (never acknowledged)."""
        removed = 0
        for partial in self.root.glob("*/*/.*.part"):
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
                removed += 1
        return removed

    def _make_folder(self, folder: Path) -> None:
        if folder.is_dir():
            return
        folder.mkdir(parents=True, exist_ok=True)
        _fsync_dir(folder.parent)

    def _check_space(self, size: int) -> None:
        if self.min_free_bytes <= 0:
            return
        free = shutil.disk_usage(self.root).free
        if free - size < self.min_free_bytes:
            raise OSError(errno.ENOSPC, "free space below the configured reserve")


def _write_new(folder: Path, target: Path, encoded: bytes) -> bool:
    """Write, fsync, link into place; False if another writer got there first."""
    temporary = folder / f".{target.name}.{uuid.uuid4().hex}.part"
    try:
        with open(temporary, "xb") as handle:
            handle.write(encoded)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, target)
        except FileExistsError:
            return False
        _fsync_dir(folder)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _duplicate(stored: StoredInstance) -> StoredInstance:
    logger.info("instance %s received again: kept the stored copy", stored.sop_instance_uid)
    return StoredInstance(
        study_instance_uid=stored.study_instance_uid,
        sop_instance_uid=stored.sop_instance_uid,
        sop_class_uid=stored.sop_class_uid,
        path=stored.path,
        disposition=Disposition.DUPLICATE,
    )


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def study_instances(folder: Path) -> list[Path]:
    """The instance files of one study folder (temporary files excluded), sorted."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.suffix == INSTANCE_SUFFIX and not path.name.startswith(".")
    )
