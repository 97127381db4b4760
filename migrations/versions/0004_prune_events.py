"""Prune events: what each purge attempt names, as columns of `wal_events`, and the
indexes its reads (by kind, newest first) and its retention (by age) use.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("procedure_id", sa.String(64)),
    ("target", sa.BigInteger()),
    ("log_start_before", sa.BigInteger()),
    ("log_start_after", sa.BigInteger()),
    ("high_watermark", sa.BigInteger()),
    ("message", sa.Text()),
)


def upgrade() -> None:
    # Batch mode: SQLite cannot drop columns in place (downgrade), so both go through it.
    with op.batch_alter_table("wal_events") as batch:
        for name, type_ in _COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    op.create_index("ix_wal_events_kind_at", "wal_events", ["kind", "at"])
    op.create_index("ix_wal_events_at", "wal_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_wal_events_at", table_name="wal_events")
    op.drop_index("ix_wal_events_kind_at", table_name="wal_events")
    with op.batch_alter_table("wal_events") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
