"""``replica_destinations``: each replica's destinations digest (kind:name -> digest),
written with its lease renewals, so a replica configured differently from the others is
named (radserve.store.replica_config).

Revision ID: 0014_replica_destinations
Revises: 0013_lease_renewed
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_replica_destinations"
down_revision: str | None = "0013_lease_renewed"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replica_destinations",
        sa.Column("instance", sa.String(120), nullable=False),
        sa.Column("destinations", sa.JSON(), nullable=False),
        sa.Column("renewed", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("instance", name=op.f("pk_replica_destinations")),
    )


def downgrade() -> None:
    op.drop_table("replica_destinations")
