"""Result lineage: which generation of a study's results each job wrote, so a re-run
supersedes the earlier result instead of standing beside it.

Revision ID: 0007_result_lineage
Revises: 0006_audit_key_id
Create Date: 2025-01-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_result_lineage"
down_revision: str | None = "0006_audit_key_id"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "result_lineage",
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("study_instance_uid", sa.String(64), nullable=False),
        sa.Column("pipeline_name", sa.String(128), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_result_lineage")),
        sa.UniqueConstraint(
            "study_instance_uid",
            "pipeline_name",
            "generation",
            name=op.f("uq_result_lineage_study_instance_uid"),
        ),
    )
    op.create_index(
        "ix_result_lineage_study_pipeline",
        "result_lineage",
        ["study_instance_uid", "pipeline_name"],
    )


def downgrade() -> None:
    op.drop_index("ix_result_lineage_study_pipeline", table_name="result_lineage")
    op.drop_table("result_lineage")
