"""Outbox rows get a kind: ``dicom`` (C-STORE to a DICOM peer) or ``fhir`` (a Bundle
POSTed to a FHIR server); rows that exist are DICOM deliveries.

Revision ID: 0003_outbox_kind
Revises: 0002_outbox
Create Date: 2025-01-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_outbox_kind"
down_revision: str | None = "0002_outbox"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite cannot add a CHECK constraint to an existing table in place
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.add_column(sa.Column("kind", sa.String(8), nullable=False, server_default="dicom"))
        batch.create_check_constraint(
            op.f("ck_outbox_deliveries_kind"), "kind IN ('dicom', 'fhir')"
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.drop_constraint(op.f("ck_outbox_deliveries_kind"), type_="check")
        batch.drop_column("kind")
