"""The SQL kv's last delete: `metasrv_kv_revision.deleted_revision`, the revision of the
latest write that removed a key. A follower's watch (metasrv/kv/_watch.py) counts the keys
under its prefix only when it moved, instead of at every take-over.

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
    with op.batch_alter_table("metasrv_kv_revision") as batch:
        batch.add_column(
            sa.Column("deleted_revision", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("metasrv_kv_revision") as batch:
        batch.drop_column("deleted_revision")
