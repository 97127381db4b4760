"""SQL backend leader election: the lease rows (metasrv/election/_sql.py).

Revision ID: 0003
Revises: 0002
Create Date: 2025-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metasrv_election",
        # "C" collation on PostgreSQL, as the kv keys (see metasrv/sql/_schema.py).
        sa.Column(
            "name",
            sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql"),
            nullable=False,
        ),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_metasrv_election"),
    )


def downgrade() -> None:
    op.drop_table("metasrv_election")
