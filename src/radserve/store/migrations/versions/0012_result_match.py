"""Result instances: a keyed hash (HMAC) of the Patient ID and the Study Date, indexed,
so that QIDO-RS searches by patient or date read only the rows they can match. Rows
indexed before are filled in by the first such search (radserve.gateway.dicomweb.qido).

Revision ID: 0012_result_match
Revises: 0011_outbox_critical
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_result_match"
down_revision: str | None = "0011_outbox_critical"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("result_instances") as batch:
        batch.add_column(sa.Column("patient_key", sa.String(64), nullable=True))
        batch.add_column(sa.Column("match_key_id", sa.String(16), nullable=True))
        batch.add_column(sa.Column("study_date", sa.String(8), nullable=True))
        batch.create_index(op.f("ix_result_instances_patient_key"), ["patient_key"])
        batch.create_index(op.f("ix_result_instances_match_key_id"), ["match_key_id"])
        batch.create_index(op.f("ix_result_instances_study_date"), ["study_date"])


def downgrade() -> None:
    with op.batch_alter_table("result_instances") as batch:
        batch.drop_index(op.f("ix_result_instances_study_date"))
        batch.drop_index(op.f("ix_result_instances_match_key_id"))
        batch.drop_index(op.f("ix_result_instances_patient_key"))
        batch.drop_column("study_date")
        batch.drop_column("match_key_id")
        batch.drop_column("patient_key")
