"""Outbox: one row per (result instance, DICOM destination), retried until delivered.

Revision ID: 0002_outbox
Revises: 0001_initial
Create Date: 2025-01-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_outbox"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("destination", sa.String(64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sop_class_uid", sa.String(64), nullable=False),
        sa.Column("sop_instance_uid", sa.String(64), nullable=False),
        sa.Column("study_instance_uid", sa.String(64), nullable=False),
        sa.Column("transfer_syntax_uid", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", _TS, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created", _TS, nullable=False),
        sa.Column("updated", _TS, nullable=False),
        sa.Column("sent_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_deliveries")),
        sa.UniqueConstraint(
            "sop_instance_uid",
            "destination",
            name=op.f("uq_outbox_deliveries_instance_destination"),
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'sending', 'sent', 'failed_permanent')",
            name=op.f("ck_outbox_deliveries_state"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_outbox_deliveries_attempts")),
    )
    op.create_index(op.f("ix_outbox_deliveries_job_id"), "outbox_deliveries", ["job_id"])
    op.create_index(
        op.f("ix_outbox_deliveries_state_due"), "outbox_deliveries", ["state", "next_attempt_at"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_outbox_deliveries_state_due"), table_name="outbox_deliveries")
    op.drop_index(op.f("ix_outbox_deliveries_job_id"), table_name="outbox_deliveries")
    op.drop_table("outbox_deliveries")
