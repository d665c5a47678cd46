"""DICOMweb wired into the service: STOW-RS studies become jobs through the intake.

The protocol (multipart bodies, part checks, the Store Instances Response, WADO-RS and
QIDO-RS look-ups) is :mod:`radserve.gateway.dicomweb`; this module only binds STOW-RS to
:class:`~radserve.service.intake.Intake`, as :mod:`radserve.service.gateway` binds the
storage SCP.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from radserve.domain.priority import PriorityClass
from radserve.gateway.completeness import CompletedStudy
from radserve.gateway.dicomweb.stow import StowIntake, StowPart, StowResult
from radserve.ingest.policy import IngestPolicy
from radserve.service.catalog import ResolvedPipeline
from radserve.service.intake import DICOMWEB_SOURCE, Intake, Origin, Submission

logger = logging.getLogger(__name__)
# studies filed for the quiet period whose filer is remembered (the oldest forgotten past
# it: that study's job is then submitted as before, by no key)
MAX_FILERS = 10_000


class StowBridge:
    """STOW-RS -> intake. ``start``/``stop`` run the quiet-period monitor."""

    def __init__(self, intake: Intake, *, data_dir: Path, quiet_s: float = 10.0) -> None:
        self.intake = intake
        # study UID -> who filed it last for the quiet period (key, client, visibility):
        # its job is theirs, as a complete study's is; before 2026-12-07 the job had no
        # key, so under a visibility rule the site that sent it could not see it
        self._filers: dict[str, Origin] = {}
        self._filers_lock = threading.Lock()
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
        before the response (``quiet``: filed for the quiet period instead)."""

        def submit(streams: list[BinaryIO]) -> Submission:
            return self.intake.submit_upload(
                streams, resolved=resolved, priority=priority, origin=origin
            )

        result = self.stow.store(
            parts,
            target_study=target_study,
            submit=None if quiet else submit,
            retry_after=self.intake.scheduler.config.default_retry_after_s,
        )
        if result.waiting:
            with self._filers_lock:
                for study in result.waiting:
                    self._filers.pop(study, None)  # the latest filer, newest last
                    self._filers[study] = origin
                while len(self._filers) > MAX_FILERS:
                    del self._filers[next(iter(self._filers))]
        return result

    def _on_study(self, study: CompletedStudy) -> None:
        """A study filed over STOW went quiet: store it and queue its job (raising makes
        the tracker offer it again later; its files stay on disk)."""
        stored = self.intake.storage.store_study_files(list(study.instances))
        resolved = self.intake.catalog.resolve(None)
        with self._filers_lock:  # kept for late instances (the next generation)
            filer = self._filers.get(study.study_instance_uid)
        submission = self.intake.submit_stored(
            stored.path,
            stored.fingerprint,
            resolved=resolved,
            priority=None,
            origin=filer or Origin(client="dicomweb", source=DICOMWEB_SOURCE),
            reuse=True,  # re-sent unchanged: no new job
        )
        logger.info(
            "job %s from DICOMweb after the quiet period (%s, generation %d)",
            submission.job.id,
            "cached" if submission.cached else "queued",
            study.generation,
        )


__all__ = ["StowBridge"]
