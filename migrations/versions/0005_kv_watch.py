"""What a follower's watch on the SQL kv reads (metasrv/kv/_sql_watch.py): an index on
`metasrv_kv.mod_revision`, for its poll of the keys written after a revision (without it,
every poll reads the whole table: half a core of PostgreSQL at a million routes), and
`metasrv_kv_revision.deleted_revision`, the revision of the latest write that removed a
key, so the watch counts the keys under its prefix only when that moved.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_metasrv_kv_mod_revision", "metasrv_kv", ["mod_revision"])
    with op.batch_alter_table("metasrv_kv_revision") as batch:
        batch.add_column(
            sa.Column("deleted_revision", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("metasrv_kv_revision") as batch:
        batch.drop_column("deleted_revision")
    op.drop_index("ix_metasrv_kv_mod_revision", table_name="metasrv_kv")
