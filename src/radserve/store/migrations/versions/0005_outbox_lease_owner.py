"""Outbox rows record who holds their lease (``<instance id>/<incarnation>``), so a
restarted server reclaims the rows it left ``sending`` instead of waiting the lease out.

Revision ID: 0005_outbox_lease_owner
Revises: 0004_result_instances
Create Date: 2025-01-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_outbox_lease_owner"
down_revision: str | None = "0004_result_instances"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.drop_column("lease_owner")
