"""``model_deployments.action`` admits ``undeploy``: removing a shadow is recorded as
what it is, not as a ``deploy`` row with an empty shadow (radserve.service.lifecycle).

Revision ID: 0018_deployment_undeploy
Revises: 0017_console_sessions
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_deployment_undeploy"
down_revision: str | None = "0017_console_sessions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "action IN ('deploy', 'promote', 'rollback', 'auto_rollback')"
_NEW = "action IN ('deploy', 'promote', 'rollback', 'auto_rollback', 'undeploy')"


def upgrade() -> None:
    with op.batch_alter_table("model_deployments") as batch:
        batch.drop_constraint(op.f("ck_model_deployments_action"), type_="check")
        batch.create_check_constraint(op.f("ck_model_deployments_action"), sa.text(_NEW))


def downgrade() -> None:
    # the rows keep the step's state; only the name of the change is the older one's
    op.execute("UPDATE model_deployments SET action = 'deploy' WHERE action = 'undeploy'")
    with op.batch_alter_table("model_deployments") as batch:
        batch.drop_constraint(op.f("ck_model_deployments_action"), type_="check")
        batch.create_check_constraint(op.f("ck_model_deployments_action"), sa.text(_OLD))
