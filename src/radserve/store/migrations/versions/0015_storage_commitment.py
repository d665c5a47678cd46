"""Storage commitment: outbox state ``committing`` (stored by the destination, its
commitment awaited) and the row's Storage Commitment Transaction UID, so a report that
arrives after a restart is still matched (radserve.gateway.commitment).

Revision ID: 0015_storage_commitment
Revises: 0014_replica_destinations
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_storage_commitment"
down_revision: str | None = "0014_replica_destinations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "state IN ('pending', 'sending', 'sent', 'failed_permanent', 'held')"
_NEW = "state IN ('pending', 'sending', 'sent', 'failed_permanent', 'held', 'committing')"


def upgrade() -> None:
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.add_column(sa.Column("commitment_uid", sa.String(64), nullable=True))
        batch.drop_constraint(op.f("ck_outbox_deliveries_state"), type_="check")
        batch.create_check_constraint(op.f("ck_outbox_deliveries_state"), sa.text(_NEW))
        batch.create_index(
            op.f("ix_outbox_deliveries_commitment_uid"), ["commitment_uid"], unique=False
        )


def downgrade() -> None:
    # an awaited commitment is forgotten: the row is sent again
    op.execute("UPDATE outbox_deliveries SET state = 'pending' WHERE state = 'committing'")
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.drop_index(op.f("ix_outbox_deliveries_commitment_uid"))
        batch.drop_constraint(op.f("ck_outbox_deliveries_state"), type_="check")
        batch.create_check_constraint(op.f("ck_outbox_deliveries_state"), sa.text(_OLD))
        batch.drop_column("commitment_uid")
