"""Job leases for replicas sharing one database, and outbox rows held until their
job's result is recorded.

``jobs.lease_owner`` (``<instance id>/<incarnation>``) and ``jobs.lease_expires``: the
replica that runs an unfinished job holds its lease and renews it; another replica takes
the job over only after it expired, and the job's writes (running, failed, its result)
are fenced by the owner. Outbox state ``held``: deliveries of a result that is not yet
recorded; recording the result releases them (``pending``) in the same transaction.

Revision ID: 0010_job_leases
Revises: 0009_model_deployments
Create Date: 2025-01-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_job_leases"
down_revision: str | None = "0009_model_deployments"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATES = "state IN ('pending', 'sending', 'sent', 'failed_permanent')"
_NEW_STATES = "state IN ('pending', 'sending', 'sent', 'failed_permanent', 'held')"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(200), nullable=True))
        batch.add_column(sa.Column("lease_expires", sa.DateTime(timezone=True), nullable=True))
        batch.create_index("ix_jobs_lease_owner", ["lease_owner"])
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.drop_constraint(op.f("ck_outbox_deliveries_state"), type_="check")
        batch.create_check_constraint(op.f("ck_outbox_deliveries_state"), sa.text(_NEW_STATES))


def downgrade() -> None:
    op.execute("DELETE FROM outbox_deliveries WHERE state = 'held'")
    with op.batch_alter_table("outbox_deliveries") as batch:
        batch.drop_constraint(op.f("ck_outbox_deliveries_state"), type_="check")
        batch.create_check_constraint(op.f("ck_outbox_deliveries_state"), sa.text(_OLD_STATES))
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_lease_owner")
        batch.drop_column("lease_expires")
        batch.drop_column("lease_owner")
