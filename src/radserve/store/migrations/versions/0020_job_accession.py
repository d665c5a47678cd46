"""The study's Accession Number on the job row, so the console's worklist searches every
job a reader may see in the query (it searched the newest 1,000 jobs' study headers, so
an older accession was silently not found).

Rows written before this revision hold None ("not read yet"): the console fills them
from the stored studies' headers in the background (radserve.console.accessions). No
index: the search matches any part of the number, which a B-tree cannot serve; the
query walks ``ix_jobs_arrival_id`` newest first and stops at a full page.

Downgrade: the column is dropped (it is read again from the studies).

Revision ID: 0020_job_accession
Revises: 0019_lineage_scope
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_job_accession"
down_revision: str | None = "0019_lineage_scope"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("accession", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("accession")
