"""DICOMweb wired into the service: STOW-RS studies become jobs through the intake.

The protocol (multipart bodies, part checks, the Store Instances Response, WADO-RS and
QIDO-RS look-ups) is :mod:`radserve.gateway.dicomweb`; this module only binds STOW-RS to
:class:`~radserve.service.intake.Intake`, as :mod:`radserve.service.gateway` binds the
storage SCP.

A study filed for the quiet period becomes a job of the key that filed it (the latest,
when several did), as a complete study's job is: under ``security.visibility`` the
sending site sees it. Who filed it is written into the study's folder
(:data:`FILER_FILE`), fsynced before the STOW-RS response, so a restart during the
quiet period keeps it (it was kept in memory until 2026-12-07: after a restart the job
had no key and the sending site could not see it). The file holds the key's id, the
client address and whether a visibility rule limited the key, never a secret.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from radserve import durable
from radserve.domain.priority import PriorityClass
from radserve.gateway.completeness import CompletedStudy, RefusalReason, Refused
from radserve.gateway.dicomweb.stow import StowIntake, StowPart, StowResult
from radserve.ingest.policy import IngestPolicy
from radserve.service.catalog import ResolvedPipeline
from radserve.service.gateway import handover_warnings, refused_warning
from radserve.service.intake import DICOMWEB_SOURCE, Intake, Origin, Submission

logger = logging.getLogger(__name__)

# who filed a study for the quiet period, in the study's folder beside the instances
# and the tracker's hand-over marker (a dot name: never taken for an instance)
FILER_FILE = ".radserve-filer.json"
_FILER_VERSION = 1
# what is read back of it: a filer is ~100 bytes; a larger file is damaged, not read
_MAX_FILER_BYTES = 4096
# the job row's columns the filer goes into (jobs.api_key_id, jobs.client_address)
_MAX_KEY_ID = 32
_MAX_CLIENT = 128

# the visibility rule's group of a key or local user (ReadAccess.group_of): "" when no
# rule applies; two submitters see each other's jobs exactly when their groups match
GroupOf = Callable[[str | None], str]


@dataclass(frozen=True)
class Filer:
    """Who filed a study for the quiet period: what its job's :class:`Origin` needs.

    ``restricted``: a visibility rule limited the key when it filed (its ``Origin.sees``
    was set); an admin key's, or any key's under ``visibility: all``, was not."""

    key_id: str
    client: str | None
    restricted: bool

    @classmethod
    def of(cls, origin: Origin) -> Filer | None:
        """The filer of a STOW-RS request (None: no key filed it)."""
        if origin.key_id is None:
            return None
        return cls(origin.key_id, origin.client, origin.sees is not None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _FILER_VERSION,
            "key_id": self.key_id,
            "client": self.client,
            "restricted": self.restricted,
        }

    @classmethod
    def from_json(cls, data: object) -> Filer:
        """Raises ValueError naming what is wrong (never the values: a damaged file may
        hold anything)."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") != _FILER_VERSION:
            raise ValueError(f"version is not {_FILER_VERSION}")
        key_id, client, restricted = data.get("key_id"), data.get("client"), data.get("restricted")
        if not _field_ok(key_id, _MAX_KEY_ID):
            raise ValueError(f"key_id is not 1 to {_MAX_KEY_ID} printable ASCII characters")
        if client is not None and not _field_ok(client, _MAX_CLIENT):
            raise ValueError(f"client is neither null nor 1 to {_MAX_CLIENT} printable characters")
        if not isinstance(restricted, bool):
            raise ValueError("restricted is not true or false")
        return cls(str(key_id), client, restricted)


def _field_ok(value: object, limit: int) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= limit
        and value.isascii()
        and value.isprintable()
    )


def write_filer(folder: Path, filer: Filer | None) -> bool:
    """Record ``filer`` as the study's latest (atomically, fsynced with its folder, as
    the instances are); unchanged when it already is (a sender of one instance per
    request pays one small read, not one more fsync). None (no key filed it): the
    record of an earlier filer is removed, so the job is not theirs. Best effort: a
    record that cannot be written is removed too and the job has no key, as before.
    Returns whether the study had another filer before (another sender, or none)."""
    path = folder / FILER_FILE
    earlier = read_filer(folder, quiet=True)
    if filer is not None and earlier == filer:
        return False
    try:
        if filer is None:
            path.unlink(missing_ok=True)
        else:
            durable.write_json(path, filer.to_json())
        return earlier != filer
    except OSError as exc:
        logger.warning("cannot record who filed study %s: %s", folder.name, exc)
    try:
        path.unlink(missing_ok=True)  # never an earlier filer's job by mistake
    except OSError as exc:
        logger.warning("cannot remove the filer record of study %s: %s", folder.name, exc)
    return earlier != filer


def read_filer(folder: Path, *, quiet: bool = False) -> Filer | None:
    """The study's latest filer, or None: none recorded, or a record that is not a
    small regular file of the expected form (a damaged or planted file is ignored with
    a warning; its job then has no key). ``quiet``: no warning (a check before a write)."""
    try:
        data = durable.read_small_json(folder / FILER_FILE, _MAX_FILER_BYTES)
        return None if data is None else Filer.from_json(data)
    except ValueError as exc:
        if not quiet:
            logger.warning(
                "study %s: its filer record (%s) is unusable and ignored (%s); its job "
                "will have no key",
                folder.name,
                FILER_FILE,
                exc,
            )
        return None


def origin_of(filer: Filer | None, group_of: GroupOf) -> Origin:
    """The job's origin for a study filed by ``filer``: its key and client, and (when a
    visibility rule limited it) the earlier jobs that may answer it: those of its own
    group under the rule, what ``submitter_sees`` allowed it when it filed."""
    if filer is None:
        return Origin(client="dicomweb", source=DICOMWEB_SOURCE)
    own = group_of(filer.key_id) if filer.restricted else ""
    if not own:  # not limited, or no rule applies now (visibility: all)
        return Origin(filer.key_id, filer.client, source=DICOMWEB_SOURCE)

    def sees(actor: str | None) -> bool:
        return group_of(actor) == own

    return Origin(filer.key_id, filer.client, source=DICOMWEB_SOURCE, sees=sees)


class StowBridge:
    """STOW-RS -> intake. ``start``/``stop`` run the quiet-period monitor."""

    def __init__(
        self, intake: Intake, *, data_dir: Path, group_of: GroupOf, quiet_s: float = 10.0
    ) -> None:
        """``group_of``: the visibility rule (``ReadAccess.group_of``) by which a
        quiet-period job's filer may be answered from an earlier job."""
        self.intake = intake
        self._group_of = group_of
        self.stow: StowIntake[Submission] = StowIntake(
            self._on_study,
            data_dir=data_dir,
            quiet_s=quiet_s,
            own_results=intake.own_results,
            policy=IngestPolicy.from_settings(intake.settings.ingest),
        )

    def start(self) -> None:
        self.stow.start()

    def stop(self) -> None:
        self.stow.stop()

    def store(
        self,
        parts: Sequence[StowPart],
        *,
        target_study: str | None,
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
        quiet: bool = False,
    ) -> StowResult[Submission]:
        """One STOW-RS request: each complete study is stored and its job committed
        before the response (``quiet``: filed for the quiet period instead, and who
        filed it recorded before the response)."""

        def submit(streams: list[BinaryIO], refused: Sequence[RefusalReason]) -> Submission:
            # the study's parts this request refused are named in its job's warnings
            missing = Refused.of(refused)
            warned = origin
            if missing is not None:
                more = (refused_warning(missing, len(streams)),)
                warned = replace(origin, warnings=(*origin.warnings, *more))
            return self.intake.submit_upload(
                streams, resolved=resolved, priority=priority, origin=warned
            )

        filer = Filer.of(origin)
        changed: list[tuple[str, Path]] = []

        def record_filer(study: str, folder: Path) -> None:
            # before the study's first instance of this request is tracked: the quiet
            # period cannot hand it over before its filer is on disk (written after the
            # whole request until 2026-12-07, so a quiet period shorter than the rest of
            # the request gave the job no key, which its site could not see)
            if write_filer(folder, filer):
                changed.append((study, folder))

        result = self.stow.store(
            parts,
            target_study=target_study,
            submit=None if quiet else submit,
            retry_after=self.intake.scheduler.config.default_retry_after_s,
            on_filing=record_filer if quiet else None,
        )
        for study, folder in changed:
            # another sender: its re-send of instances already here is new to it, so
            # the study is handed over again and the re-send look-up decides who
            # answers it (Store.find_answered: only a job this sender may see);
            # before, identical instances never reopened a handed-over study and a
            # second site's study got no job of its own
            self.stow.tracker.arrived(study, folder)
        return result

    def _on_study(self, study: CompletedStudy) -> None:
        """A study filed over STOW went quiet: store it and queue its job (raising makes
        the tracker offer it again later; its files stay on disk). Its filer is read
        from its folder: the same after a restart as before."""
        stored = self.intake.storage.store_study_files(list(study.instances))
        resolved = self.intake.catalog.resolve(None)
        submission = self.intake.submit_stored(
            stored.path,
            stored.fingerprint,
            resolved=resolved,
            priority=None,
            # what the hand-over knows (the parts of the study STOW-RS refused)
            origin=replace(
                origin_of(read_filer(study.folder), self._group_of),
                warnings=handover_warnings(study),
            ),
            reuse=True,  # re-sent unchanged: no new job
        )
        logger.info(
            "job %s from DICOMweb after the quiet period (%s, generation %d)",
            submission.job.id,
            "cached" if submission.cached else "queued",
            study.generation,
        )


__all__ = ["FILER_FILE", "Filer", "StowBridge", "origin_of", "read_filer", "write_filer"]
