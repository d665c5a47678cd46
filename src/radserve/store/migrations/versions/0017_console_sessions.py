"""``console_sessions`` and ``console_signin_failures``: the console's sign-in sessions
(by the SHA-256 of the session id, never the id) and failed sign-ins per client address
in the store, so every replica on one database shares them (radserve.store.console).

Revision ID: 0017_console_sessions
Revises: 0016_commitment_requests
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_console_sessions"
down_revision: str | None = "0016_commitment_requests"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("key_name", sa.String(128), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("site", sa.String(128), nullable=True),
        sa.Column("submitter", sa.String(128), nullable=True),
        sa.Column("username", sa.String(64), nullable=True),
        sa.Column("user_check", sa.String(64), nullable=True),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created", _TS, nullable=False),
        sa.Column("expires", _TS, nullable=False),
        sa.Column("last_seen", _TS, nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_console_sessions")),
        sa.CheckConstraint(
            "role IN ('read', 'submit', 'admin')", name=op.f("ck_console_sessions_role")
        ),
    )
    op.create_index(op.f("ix_console_sessions_key_id"), "console_sessions", ["key_id"])
    op.create_table(
        "console_signin_failures",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_signin_failures")),
    )
    op.create_index(
        op.f("ix_console_signin_failures_client_at"),
        "console_signin_failures",
        ["client", "at"],
    )
    op.create_index(op.f("ix_console_signin_failures_at"), "console_signin_failures", ["at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_console_signin_failures_at"), table_name="console_signin_failures")
    op.drop_index(
        op.f("ix_console_signin_failures_client_at"), table_name="console_signin_failures"
    )
    op.drop_table("console_signin_failures")
    op.drop_index(op.f("ix_console_sessions_key_id"), table_name="console_sessions")
    op.drop_table("console_sessions")
