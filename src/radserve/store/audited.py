"""The store of a process that appends to the audit chain, with its audit trail bound.

Every such process (the server, ``radserve keys``, ``radserve export``, ``radserve
outbox``) opens its store here, so every record is keyed and checkpointed
(:class:`radserve.audit.trail.AuditTrail`). It sits in the store package because the
store imports the audit chain, not the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radserve.audit.trail import AuditTrail
from radserve.store.store import Store, init_store

if TYPE_CHECKING:
    from radserve.config import Settings

__all__ = ["open_audited"]


def open_audited(settings: Settings, *, export: bool = False) -> tuple[Store, AuditTrail]:
    """The store of ``settings`` with its audit key and trail (not started: a process
    without :meth:`AuditTrail.start` writes each checkpoint at once)."""
    trail = AuditTrail(settings)
    store = init_store(
        settings.effective_database_url, audit_key=trail.key, on_audit=trail.appended
    )
    trail.attach(store, export=export)
    return store, trail
