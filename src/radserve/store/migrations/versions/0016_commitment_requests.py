"""Storage commitment requests: every (Transaction UID, outbox row) an N-ACTION asked,
kept after the row moves on (sent again under a new transaction, rescheduled, failed),
so a report that arrives after its deadline still names rows radserve knows
(radserve.gateway.commitment_ledger) and only a truly unknown transaction is refused.

Revision ID: 0016_commitment_requests
Revises: 0015_storage_commitment
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_commitment_requests"
down_revision: str | None = "0015_storage_commitment"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "outbox_commitment_requests",
        sa.Column("transaction_uid", sa.String(64), nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["outbox_deliveries.id"],
            name=op.f("fk_outbox_commitment_requests_delivery_id_outbox_deliveries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "transaction_uid", "delivery_id", name=op.f("pk_outbox_commitment_requests")
        ),
    )
    # the rows still awaiting a transaction are its requests too
    op.execute(
        "INSERT INTO outbox_commitment_requests (transaction_uid, delivery_id, requested_at) "
        "SELECT commitment_uid, id, updated FROM outbox_deliveries "
        "WHERE commitment_uid IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_table("outbox_commitment_requests")
