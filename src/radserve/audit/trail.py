"""The audit trail of one process: the key, the checkpoint writer and (in the server)
the syslog exporter, wired to the store as its audit listener.

Every process that appends to the chain opens its store through
:func:`radserve.store.audited.open_audited` (the server, ``radserve keys``, ``radserve
export``), so every record is keyed and checkpointed; only the server exports (it also
picks up the other processes' records). That opener lives with the store, which imports
this package's chain; this package refers to the store only in annotations.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from radserve.audit.chain import AuditRecord
from radserve.audit.seal import AuditSeal, CheckpointFile, checkpoint_path, load_key

if TYPE_CHECKING:
    from radserve.audit.syslog import SyslogExporter
    from radserve.config import Settings
    from radserve.store import Store

logger = logging.getLogger(__name__)


class AuditTrail:
    """Key + checkpoints (+ export). ``appended`` is the store's audit listener."""

    def __init__(self, settings: Settings, *, chain_key_id: str | None = None) -> None:
        """``chain_key_id``: the key id the stored chain is keyed with (see ``load_key``)."""
        self.settings = settings
        self.key = load_key(settings, chain_key_id=chain_key_id)
        self.checkpoints = CheckpointFile(checkpoint_path(settings))
        self.seal = AuditSeal(
            self.key, self.checkpoints, interval_s=settings.audit.checkpoint_interval_s
        )
        self.exporter: SyslogExporter | None = None
        self._store: Store | None = None

    def attach(self, store: Store, *, export: bool = False) -> None:
        """Bind to ``store``; with ``export`` and ``audit.syslog`` set, build the exporter."""
        self._store = store
        self.seal._keyed_from = store.audit_keyed_from
        syslog = self.settings.audit.syslog
        if export and syslog is not None:
            from radserve.audit.syslog import SyslogExporter

            cursor = syslog.cursor_file or self.settings.data_dir / "audit" / "syslog.cursor"
            self.exporter = SyslogExporter(syslog, store, self.key, cursor)
            self.seal.listeners.append(self.exporter.offer_checkpoint)

    def appended(self, records: Sequence[AuditRecord]) -> None:
        self.seal.appended(records)
        if self.exporter is not None:
            self.exporter.notify()

    def start(self) -> None:
        """Threads: checkpoints every ``checkpoint_interval_s``, and the exporter."""
        self.seal.start()
        if self.exporter is not None:
            self.exporter.start()

    def stop(self) -> None:
        """Final checkpoint, then one last delivery attempt (nothing is lost if it fails)."""
        self.seal.stop()
        if self.exporter is not None:
            self.exporter.notify()
            self.exporter.stop()


__all__ = ["AuditTrail"]
