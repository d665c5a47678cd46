"""Run the Alembic migrations programmatically (``alembic upgrade head`` without an ini file).

Several processes may start at once (API, workers, a CLI command on the same data
dir): the upgrade holds a lock for its whole transaction — ``BEGIN IMMEDIATE`` on
SQLite, a transaction-scoped advisory lock on PostgreSQL — so exactly one of them
migrates and the others then find the schema at head.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, text

from radserve.store.db import writer
from radserve.store.deadline import NO_DEADLINE
from radserve.store.errors import SchemaNotCurrentError

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# arbitrary constant naming radserve's migration lock among PostgreSQL advisory locks
_PG_MIGRATION_LOCK = 0x7261647365727665  # "radserve"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations, optionally bound to a connection."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


ONLY_READS = "a command that only reads never migrates a store"
ONLY_SERVE_UPGRADES = "of the commands, only `radserve serve` migrates a store"
NEWER_NOT_READ = "a server never runs on a schema newer than its own"


def require_head(engine: Engine, why: str = ONLY_READS) -> None:
    """Refuse a schema other than this code's head, changing nothing: the check of a
    command that only reads (an upgrade under older servers still running on the store
    would change their database beneath them)."""
    current = current_revision(engine)
    if current != head_revision():
        raise not_current(current, why)


def not_current(current: str | None, why: str) -> SchemaNotCurrentError:
    """The refusal of a store at ``current`` by a command that does not upgrade (``why``)."""
    head = head_revision()
    known = current is not None and is_known(current)
    found = f"schema revision {current}" if current else "no radserve schema (schema revision none)"
    how = (
        "`radserve serve` of this version upgrades it at start (stop the servers of the "
        "older version first), or use the radserve version that matches it"
        if known or current is None
        else "a newer radserve wrote it: use that version (`radserve serve` cannot go back)"
    )
    return SchemaNotCurrentError(
        f"the database holds {found}; this radserve reads {head}: nothing was changed "
        f"({why}). {how}"
    )


def serve_refusal(current: str | None) -> SchemaNotCurrentError | None:
    """The refusal :func:`upgrade` (``radserve serve``) gives a store at ``current``, in
    its words (a revision a newer radserve wrote), or None where serve migrates or runs
    on it; what ``radserve doctor`` says of it too."""
    if current is not None and not is_known(current):
        return not_current(current, NEWER_NOT_READ)
    return None


def is_known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


def upgrade(engine: Engine, revision: str = "head", *, only_empty: bool = False) -> None:
    """Bring the schema to ``revision`` (creating it on an empty database); with
    ``only_empty`` (a writing command other than serve), create it on an empty database
    but refuse any other revision than head with :class:`SchemaNotCurrentError`, checked
    under the lock so that a store another process creates meanwhile is not upgraded."""
    # no deadline: it may wait for another server's migration (radserve.store.deadline)
    with writer(engine).execution_options(**{NO_DEADLINE: True}).begin() as connection:
        if connection.dialect.name == "postgresql":
            # another server's migration, or an older server's transactions, may hold
            # the locks this one needs for longer than the pool's lock_timeout
            connection.execute(text("SET LOCAL lock_timeout = 0"))
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK}
            )
        before = MigrationContext.configure(connection).get_current_revision()
        if only_empty and before not in (None, head_revision()):
            raise not_current(before, ONLY_SERVE_UPGRADES)
        refused = serve_refusal(before)
        if refused is not None:
            # a newer radserve migrated it: Alembic would raise "Can't locate revision"
            # with a traceback; this code must not run on a schema it does not know
            raise refused
        command.upgrade(alembic_config(connection), revision)
        after = MigrationContext.configure(connection).get_current_revision()
    if before != after:
        logger.info("database schema upgraded from %s to %s", before or "empty", after)
