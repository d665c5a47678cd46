"""Audit records carry the id of the HMAC key their hash was computed with (empty for
the unkeyed records written before audit keys existed).

Revision ID: 0006_audit_key_id
Revises: 0005_outbox_lease_owner
Create Date: 2025-01-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_audit_key_id"
down_revision: str | None = "0005_outbox_lease_owner"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit_records") as batch:
        batch.add_column(sa.Column("key_id", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_records") as batch:
        batch.drop_column("key_id")
