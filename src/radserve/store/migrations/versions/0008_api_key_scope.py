"""API keys carry an optional site and submitter: the visibility rule
(``security.visibility``) lets a read key see only its submitter's or site's studies.

Revision ID: 0008_api_key_scope
Revises: 0007_result_lineage
Create Date: 2025-01-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_api_key_scope"
down_revision: str | None = "0007_result_lineage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("site", sa.String(128), nullable=True))
        batch.add_column(sa.Column("submitter", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("submitter")
        batch.drop_column("site")
