"""Result instances: the DICOM objects radserve wrote (SEG, SR), indexed by study,
series and instance UID for DICOMweb retrieval.

Revision ID: 0004_result_instances
Revises: 0003_outbox_kind
Create Date: 2025-01-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_result_instances"
down_revision: str | None = "0003_outbox_kind"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "result_instances",
        sa.Column("sop_instance_uid", sa.String(64), nullable=False),
        sa.Column("study_instance_uid", sa.String(64), nullable=False),
        sa.Column("series_instance_uid", sa.String(64), nullable=False),
        sa.Column("sop_class_uid", sa.String(64), nullable=False),
        sa.Column("transfer_syntax_uid", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created", _TS, nullable=False),
        sa.PrimaryKeyConstraint("sop_instance_uid", name=op.f("pk_result_instances")),
    )
    op.create_index(op.f("ix_result_instances_job_id"), "result_instances", ["job_id"])
    op.create_index(
        "ix_result_instances_study_series",
        "result_instances",
        ["study_instance_uid", "series_instance_uid"],
    )


def downgrade() -> None:
    op.drop_index("ix_result_instances_study_series", table_name="result_instances")
    op.drop_index(op.f("ix_result_instances_job_id"), table_name="result_instances")
    op.drop_table("result_instances")
