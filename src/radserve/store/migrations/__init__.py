"""Alembic migrations of the radserve store (run by :func:`radserve.store.init_store`)."""
