"""Initial schema: jobs, results cache, API keys, audit chain.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
GENESIS_HASH = "0" * 64


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("priority_class", sa.String(16), nullable=False),
        sa.Column("arrival", _TS, nullable=False),
        sa.Column("deadline", _TS, nullable=False),
        sa.Column("started", _TS, nullable=True),
        sa.Column("finished", _TS, nullable=True),
        sa.Column("updated", _TS, nullable=False),
        sa.Column("pipeline_name", sa.String(128), nullable=False),
        sa.Column("pipeline_version", sa.String(64), nullable=False),
        sa.Column("precision", sa.String(8), nullable=False),
        sa.Column("model_versions", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("study_path", sa.Text(), nullable=False),
        sa.Column("result_path", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cached_from", sa.String(36), nullable=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("client_address", sa.String(128), nullable=True),
        sa.Column("stage_timings", sa.JSON(), nullable=False),
        sa.Column("queue_meta", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.ForeignKeyConstraint(
            ["cached_from"], ["jobs.id"], name=op.f("fk_jobs_cached_from_jobs")
        ),
        sa.CheckConstraint(
            "state IN ('received', 'queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_jobs_state"),
        ),
        sa.CheckConstraint(
            "priority_class IN ('URGENT', 'INPATIENT', 'OUTPATIENT')",
            name=op.f("ck_jobs_priority_class"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_jobs_attempts")),
    )
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"])
    op.create_index(op.f("ix_jobs_pipeline_name"), "jobs", ["pipeline_name"])
    op.create_index(op.f("ix_jobs_fingerprint"), "jobs", ["fingerprint"])
    op.create_index(op.f("ix_jobs_arrival_id"), "jobs", ["arrival", "id"])

    op.create_table(
        "results_cache",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("pipeline_name", sa.String(128), nullable=False),
        sa.Column("pipeline_version", sa.String(64), nullable=False),
        sa.Column("model_versions_key", sa.Text(), nullable=False),
        sa.Column("precision", sa.String(8), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("created", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results_cache")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_results_cache_job_id_jobs")),
        sa.UniqueConstraint("job_id", name=op.f("uq_results_cache_job_id")),
        sa.UniqueConstraint(
            "fingerprint",
            "pipeline_name",
            "pipeline_version",
            "model_versions_key",
            "precision",
            name=op.f("uq_results_cache_key"),
        ),
    )

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("salt", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("created", _TS, nullable=False),
        sa.Column("revoked", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.CheckConstraint("role IN ('read', 'submit', 'admin')", name=op.f("ck_api_keys_role")),
    )

    op.create_table(
        "audit_records",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("actor_key_id", sa.String(32), nullable=True),
        sa.Column("client_address", sa.String(128), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(128), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_records")),
        sa.UniqueConstraint("hash", name=op.f("uq_audit_records_hash")),
    )
    op.create_index(op.f("ix_audit_records_action"), "audit_records", ["action"])
    op.create_index(op.f("ix_audit_records_subject"), "audit_records", ["subject"])

    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_head")),
        sa.CheckConstraint("id = 1", name=op.f("ck_audit_head_single_row")),
    )
    op.bulk_insert(head, [{"id": 1, "seq": 0, "hash": GENESIS_HASH}])


def downgrade() -> None:
    op.drop_table("audit_head")
    op.drop_index(op.f("ix_audit_records_subject"), table_name="audit_records")
    op.drop_index(op.f("ix_audit_records_action"), table_name="audit_records")
    op.drop_table("audit_records")
    op.drop_table("api_keys")
    op.drop_table("results_cache")
    op.drop_index(op.f("ix_jobs_arrival_id"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_fingerprint"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_pipeline_name"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_state"), table_name="jobs")
    op.drop_table("jobs")
