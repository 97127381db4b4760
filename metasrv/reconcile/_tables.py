"""SQL tables of the reconcile job's results, read by `GET /v1/reconcile/latest`.

Defined on the shared `metasrv.sql_schema.metadata` (which imports this module), so the
Alembic drift check covers them; migration 0002 creates them. Kept free of other metasrv
imports: `metasrv.sql_schema` imports it at its end.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
)

from metasrv.sql_schema import metadata

reconcile_runs_table = Table(
    "reconcile_runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    # "succeeded" (findings computed; apply errors are in `summary`) or "failed"
    Column("status", String(16), nullable=False),
    Column("master", String(255), nullable=False),
    Column("applied", Boolean, nullable=False),
    Column("kv_revision", BigInteger, nullable=True),
    # {kind: {severity: n}}
    Column("counts", JSON, nullable=False),
    Column("findings_total", BigInteger, nullable=False),
    # Rows kept in reconcile_findings (the most urgent first); the Parquet has them all.
    Column("findings_stored", Integer, nullable=False),
    Column("out_dir", Text, nullable=True),
    # The JSON summary written next to the Parquet (inputs, timings, notes, actions).
    Column("summary", JSON, nullable=False),
    Index(None, "finished_at"),
)

reconcile_findings_table = Table(
    "reconcile_findings",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "run_id",
        String(64),
        ForeignKey("reconcile_runs.run_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("kind", String(32), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("topic", String(255), nullable=True),
    Column("region_id", BigInteger, nullable=True),
    Column("message", Text, nullable=False),
    Column("evidence", JSON, nullable=False),
    # What --apply did about it: e.g. "registered", "topic_created", "dropped", or null.
    Column("action", String(32), nullable=True),
    Index(None, "run_id", "severity"),
    Index(None, "run_id", "kind"),
)
