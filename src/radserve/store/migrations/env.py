"""Alembic environment: radserve runs migrations programmatically on a given connection.

There is no ``alembic.ini``: :func:`radserve.store.migrate.upgrade` builds the config and
passes the (already locked) connection in ``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

from radserve.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError(
        "radserve migrations run online on a connection: use radserve.store.init_store(url)"
    )

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things; batch mode rebuilds tables for later migrations
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
