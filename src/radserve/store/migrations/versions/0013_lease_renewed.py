"""``jobs.lease_renewed``: when the job's lease was last written (granted or renewed).

With ``lease_expires`` it gives the owner's own lease length, so a replica judging a
take-over no longer assumes every replica uses its ``jobs.lease_s`` (radserve.service.
leases). Rows leased before have none; they are judged as before (expiry less this
replica's lease) until their owner's next renewal writes it.

Revision ID: 0013_lease_renewed
Revises: 0012_result_match
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_lease_renewed"
down_revision: str | None = "0012_result_match"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lease_renewed", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("lease_renewed")
