"""Initial schema: kv store, revision counter, procedure/purge history, WAL events.

Revision ID: 0001
Revises:
Create Date: 2025-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metasrv_kv",
        # "C" collation on PostgreSQL: bytewise key order, as in etcd (see metasrv/sql/_schema.py).
        sa.Column(
            "key",
            sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql"),
            nullable=False,
        ),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.Column("mod_revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_metasrv_kv"),
    )
    op.create_table(
        "metasrv_kv_revision",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_metasrv_kv_revision"),
    )
    # The kv backend locks and bumps this one row in every write transaction.
    op.execute("INSERT INTO metasrv_kv_revision (id, revision) VALUES (1, 0)")

    op.create_table(
        "procedure_history",
        sa.Column("procedure_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("topic", sa.String(255), nullable=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("step", sa.String(64), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("procedure_id", name="pk_procedure_history"),
    )
    op.create_index("ix_procedure_history_state", "procedure_history", ["state"])
    op.create_index("ix_procedure_history_topic", "procedure_history", ["topic"])

    op.create_table(
        "purge_history",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("procedure_id", sa.String(64), nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("prune_point", sa.BigInteger(), nullable=False),
        sa.Column("previous_pruned_entry_id", sa.BigInteger(), nullable=True),
        sa.Column("previous_log_start", sa.BigInteger(), nullable=True),
        sa.Column("low_watermark", sa.BigInteger(), nullable=True),
        sa.Column("entries_deleted", sa.BigInteger(), nullable=False),
        sa.Column("bytes_estimated", sa.BigInteger(), nullable=False),
        sa.Column("logical_delete", sa.Boolean(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_purge_history"),
    )
    op.create_index(
        "ix_purge_history_topic_finished_at", "purge_history", ["topic", "finished_at"]
    )

    op.create_table(
        "wal_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("region_id", sa.BigInteger(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_wal_events"),
    )
    op.create_index("ix_wal_events_topic_at", "wal_events", ["topic", "at"])


def downgrade() -> None:
    op.drop_index("ix_wal_events_topic_at", table_name="wal_events")
    op.drop_table("wal_events")
    op.drop_index("ix_purge_history_topic_finished_at", table_name="purge_history")
    op.drop_table("purge_history")
    op.drop_index("ix_procedure_history_topic", table_name="procedure_history")
    op.drop_index("ix_procedure_history_state", table_name="procedure_history")
    op.drop_table("procedure_history")
    op.drop_table("metasrv_kv_revision")
    op.drop_table("metasrv_kv")
