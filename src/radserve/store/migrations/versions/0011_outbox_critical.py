"""Outbox kind ``critical``: a critical-finding notice POSTed as JSON to a webhook.

Revision ID: 0011_outbox_critical
Revises: 0010_job_leases
Create Date: 2025-01-11
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_outbox_critical"
down_revision: str | None = "0010_job_leases"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "kind IN ('dicom', 'fhir')"
_NEW = "kind IN ('dicom', 'fhir', 'critical')"


def upgrade() -> None:
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.drop_constraint(op.f("ck_outbox_deliveries_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_outbox_deliveries_kind"), sa.text(_NEW))


def downgrade() -> None:
    op.execute("DELETE FROM outbox_deliveries WHERE kind = 'critical'")
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.drop_constraint(op.f("ck_outbox_deliveries_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_outbox_deliveries_kind"), sa.text(_OLD))
