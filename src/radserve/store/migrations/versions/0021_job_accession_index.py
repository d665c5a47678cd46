"""An index for ``GET /v1/jobs?accession=`` (an exact match): an integration engine
looking up an order's jobs made the query walk ``ix_jobs_arrival_id`` through every job
older than the newest match, a whole table for a rare or unknown number.

A hash index on PostgreSQL: the number is kept whole, as the header has it (a
non-conformant sender's 10,000 characters included), and a B-tree entry over about
2,700 bytes fails the insert (``index row size exceeds maximum``), where a hash index
stores the value's hash only. SQLite's B-tree has no such limit. The console's search
(any part of the number, any case) still walks the arrival index: a hash serves
equality only.

Downgrade: the index is dropped.

Revision ID: 0021_job_accession_index
Revises: 0020_job_accession
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021_job_accession_index"
down_revision: str | None = "0020_job_accession"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_accession", "jobs", ["accession"], postgresql_using="hash")


def downgrade() -> None:
    op.drop_index("ix_jobs_accession", table_name="jobs")
