"""Result lineage per scope: under ``security.visibility`` (``site``, ``own_submitter``)
a study's generations are counted per group of submitters who see each other's jobs, so
a site's run of a study another site ran starts the site's own lineage instead of
superseding the other site's result (radserve.service.lineage). ``scope`` is ``''``
without a rule, for gateway jobs, and for every row written before this revision.

Downgrade: one lineage per study and pipeline again; the rows of scoped lineages are
numbered after the unscoped generations of their study, oldest first (no row is lost,
so a resumed job keeps a generation of its own).

Revision ID: 0019_lineage_scope
Revises: 0018_deployment_undeploy
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_lineage_scope"
down_revision: str | None = "0018_deployment_undeploy"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNIQUE = "uq_result_lineage_study_instance_uid"  # the naming convention's, both versions


def upgrade() -> None:
    with op.batch_alter_table("result_lineage") as batch:
        batch.add_column(sa.Column("scope", sa.String(200), nullable=False, server_default=""))
        batch.drop_constraint(_UNIQUE, type_="unique")
        batch.create_unique_constraint(
            _UNIQUE, ["study_instance_uid", "pipeline_name", "scope", "generation"]
        )


def downgrade() -> None:
    with op.batch_alter_table("result_lineage") as batch:
        batch.drop_constraint(_UNIQUE, type_="unique")
    _renumber_scoped_rows()
    with op.batch_alter_table("result_lineage") as batch:
        batch.drop_column("scope")
        batch.create_unique_constraint(
            _UNIQUE, ["study_instance_uid", "pipeline_name", "generation"]
        )


def _renumber_scoped_rows() -> None:
    """Give every row of a scoped lineage a generation after its study's unscoped ones
    (oldest first), so (study, pipeline, generation) is unique again."""
    bind = op.get_bind()
    table = sa.table(
        "result_lineage",
        sa.column("job_id", sa.String),
        sa.column("study_instance_uid", sa.String),
        sa.column("pipeline_name", sa.String),
        sa.column("scope", sa.String),
        sa.column("generation", sa.Integer),
        sa.column("created", sa.DateTime),
    )
    rows = bind.execute(
        sa.select(
            table.c.job_id,
            table.c.study_instance_uid,
            table.c.pipeline_name,
            table.c.scope,
            table.c.generation,
        ).order_by(table.c.created, table.c.scope, table.c.generation, table.c.job_id)
    ).all()
    latest: dict[tuple[str, str], int] = {}
    for row in rows:
        if row.scope == "":
            group = (row.study_instance_uid, row.pipeline_name)
            latest[group] = max(latest.get(group, 0), row.generation)
    for row in rows:
        if row.scope == "":
            continue
        group = (row.study_instance_uid, row.pipeline_name)
        latest[group] = latest.get(group, 0) + 1
        bind.execute(
            sa.update(table).where(table.c.job_id == row.job_id).values(generation=latest[group])
        )
