"""The store of a process that appends to the audit chain, with its audit trail bound.

Every such process (the server, ``radserve keys``, ``radserve export``, ``radserve
outbox``) opens its store here, so every record is keyed and checkpointed
(:class:`radserve.audit.trail.AuditTrail`). It sits in the store package because the
store imports the audit chain, not the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqlalchemy.engine import make_url

from radserve.audit.trail import AuditTrail
from radserve.store.errors import NoDataError
from radserve.store.store import Store, init_store

if TYPE_CHECKING:
    from radserve.config import Settings

__all__ = ["missing_data", "open_audited"]


def missing_data(settings: Settings) -> str | None:
    """Why ``settings`` name no store yet (no data dir; no SQLite file in it), else None.

    Opening a store creates the data dir, its SQLite file and the audit key; a command
    that only reads asks this first, so that one run in the wrong folder writes nothing."""
    if not settings.data_dir.is_dir():
        return f"no data folder at {settings.data_dir}"
    url = make_url(settings.effective_database_url)
    if url.get_backend_name() == "sqlite" and not Path(url.database or "").is_file():
        return f"no database at {url.database} (data folder {settings.data_dir})"
    return None


def open_audited(
    settings: Settings, *, export: bool = False, create: bool = True, upgrade: bool = False
) -> tuple[Store, AuditTrail]:
    """The store of ``settings`` with its audit key and trail (not started: a process
    without :meth:`AuditTrail.start` writes each checkpoint at once).

    Only ``upgrade=True`` (the processes of ``radserve serve``) migrates an older schema;
    a writing command (``create=True``) creates a store on an empty database and raises
    :class:`SchemaNotCurrentError` on one of another revision, as a newer checkout
    pointed at production's database would otherwise upgrade it under the running
    older servers. ``create=False`` (commands that only read) raises
    :class:`NoDataError` where :func:`missing_data` says there is no store, instead of
    creating one, and :class:`SchemaNotCurrentError` where its schema is not this
    code's; the store is checked before the audit key is read, so a refused command
    leaves no key file behind either."""
    if not create and (why := missing_data(settings)) is not None:
        raise NoDataError(
            f"{why}: nothing was written. `radserve serve` creates it; a server's data "
            "folder is its --data-dir, RADSERVE_DATA_DIR or the config file's data_dir"
        )
    schema: Literal["upgrade", "create", "current"] = (
        "upgrade" if upgrade else "create" if create else "current"
    )
    store = init_store(settings.effective_database_url, schema=schema)
    try:
        trail = AuditTrail(settings, chain_key_id=store.audit_chain_key_id())
    except BaseException:
        store.close()
        raise
    store.audit_key, store.on_audit = trail.key, trail.appended
    trail.attach(store, export=export)
    return store, trail
