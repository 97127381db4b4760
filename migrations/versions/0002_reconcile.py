"""Reconcile results: runs and their findings (metasrv/sql/_schema.py).

Revision ID: 0002
Revises: 0001
Create Date: 2025-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reconcile_runs",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("master", sa.String(255), nullable=False),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column("kv_revision", sa.BigInteger(), nullable=True),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("findings_total", sa.BigInteger(), nullable=False),
        sa.Column("findings_stored", sa.Integer(), nullable=False),
        sa.Column("out_dir", sa.Text(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_reconcile_runs"),
    )
    op.create_index("ix_reconcile_runs_finished_at", "reconcile_runs", ["finished_at"])
    op.create_table(
        "reconcile_findings",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("topic", sa.String(255), nullable=True),
        sa.Column("region_id", sa.BigInteger(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("action", sa.String(32), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["reconcile_runs.run_id"],
            name="fk_reconcile_findings_run_id_reconcile_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_reconcile_findings"),
    )
    op.create_index(
        "ix_reconcile_findings_run_id_severity", "reconcile_findings", ["run_id", "severity"]
    )
    op.create_index("ix_reconcile_findings_run_id_kind", "reconcile_findings", ["run_id", "kind"])


def downgrade() -> None:
    op.drop_index("ix_reconcile_findings_run_id_kind", table_name="reconcile_findings")
    op.drop_index("ix_reconcile_findings_run_id_severity", table_name="reconcile_findings")
    op.drop_table("reconcile_findings")
    op.drop_index("ix_reconcile_runs_finished_at", table_name="reconcile_runs")
    op.drop_table("reconcile_runs")
