"""Model deployments: which versions serve each pipeline step (stable, canary, shadow),
one append-only row per change.

Revision ID: 0009_model_deployments
Revises: 0008_api_key_scope
Create Date: 2025-01-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_model_deployments"
down_revision: str | None = "0008_api_key_scope"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_deployments",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("step", sa.String(128), nullable=False),
        sa.Column("stable", sa.String(64), nullable=False),
        sa.Column("canary", sa.String(64), nullable=True),
        sa.Column("canary_percent", sa.Float(), nullable=False),
        sa.Column("canary_urgent", sa.Boolean(), nullable=False),
        sa.Column("shadow", sa.String(64), nullable=True),
        sa.Column("shadow_percent", sa.Float(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "action IN ('deploy', 'promote', 'rollback', 'auto_rollback')",
            name=op.f("ck_model_deployments_action"),
        ),
        sa.CheckConstraint(
            "canary_percent >= 0 AND canary_percent <= 100",
            name=op.f("ck_model_deployments_canary_percent"),
        ),
        sa.CheckConstraint(
            "shadow_percent >= 0 AND shadow_percent <= 100",
            name=op.f("ck_model_deployments_shadow_percent"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_deployments")),
    )
    op.create_index("ix_model_deployments_step_id", "model_deployments", ["step", "id"])


def downgrade() -> None:
    op.drop_index("ix_model_deployments_step_id", table_name="model_deployments")
    op.drop_table("model_deployments")
