"""Every SQL table metasrv stores, as SQLAlchemy Core metadata.

Alembic migrations (migrations/versions) create exactly these tables; a test checks
that the migrated schema matches this metadata, so code and migrations cannot drift.

- `metasrv_kv` + `metasrv_kv_revision`: the SQL kv backend (metasrv/kv/_sql.py). The
  single-row revision table is a global counter so `mod_revision` grows monotonically
  across all keys, as etcd's store revision does.
- `metasrv_election`: the SQL backend's leader lease rows, one per kv key prefix
  (metasrv/election/_sql.py).
- `procedure_history`, `purge_history`, `wal_events`: the history store (finished
  procedures, completed purges, every prune attempt's events and WAL data loss) read by
  the API; `wal_events` rows older than `history.events_retention` are deleted.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

# Stable constraint names so migrations and autogenerate comparisons agree on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

KV_KEY_MAX = 1024
"""Longest key (including the backend's key prefix) the SQL kv backend stores."""

KV_KEY_TYPE = String(KV_KEY_MAX).with_variant(String(KV_KEY_MAX, collation="C"), "postgresql")
"""Key column type. PostgreSQL gets the "C" collation so keys order bytewise as in etcd
and prefix ranges (`key >= p AND key < upper(p)`) are exact and use the primary key
index whatever the database's default locale is; SQLite's BINARY collation already is."""

kv_table = Table(
    "metasrv_kv",
    metadata,
    Column("key", KV_KEY_TYPE, primary_key=True),
    Column("value", LargeBinary, nullable=False),
    Column("mod_revision", BigInteger, nullable=False),
    # Migration 0005: a follower polls the keys written after a revision
    # (metasrv/kv/_sql_watch.py).
    Index(None, "mod_revision"),
)

kv_revision_table = Table(
    "metasrv_kv_revision",
    metadata,
    # Always exactly one row, id = 1; locked by every writing transaction.
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("revision", BigInteger, nullable=False),
    # Migration 0005: the revision of the latest write that removed a key (0: none since).
    Column("deleted_revision", BigInteger, nullable=False, server_default="0"),
)

election_table = Table(
    "metasrv_election",
    metadata,
    # Key prefix + "__metasrv_election": clusters sharing one database elect apart.
    Column("name", KV_KEY_TYPE, primary_key=True),
    # Grows by one on every takeover; the leader's fence value names it.
    Column("term", BigInteger, nullable=False),
    Column("holder", String(255), nullable=False),
    # The leader's `{"node", "addr", "term"}` JSON, also written to the election kv key.
    Column("value", LargeBinary, nullable=False),
    # Epoch seconds on the database's clock; the lease is free once it has passed.
    Column("expires_at", Float, nullable=False),
)

procedure_history_table = Table(
    "procedure_history",
    metadata,
    Column("procedure_id", String(64), primary_key=True),
    Column("kind", String(64), nullable=False),
    Column("topic", String(255), nullable=True),
    Column("state", String(32), nullable=False),
    Column("step", String(64), nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("error", Text, nullable=True),
    # [{"step", "started_at", "finished_at", "attempts", "error"}]
    Column("steps", JSON, nullable=False),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("duration_s", Float, nullable=True),
    Index(None, "state"),
    Index(None, "topic"),
)

purge_history_table = Table(
    "purge_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("procedure_id", String(64), nullable=False),
    Column("topic", String(255), nullable=False),
    Column("prune_point", BigInteger, nullable=False),
    Column("previous_pruned_entry_id", BigInteger, nullable=True),
    Column("previous_log_start", BigInteger, nullable=True),
    Column("low_watermark", BigInteger, nullable=True),
    Column("entries_deleted", BigInteger, nullable=False),
    Column("bytes_estimated", BigInteger, nullable=False),
    Column("logical_delete", Boolean, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Index(None, "topic", "finished_at"),
)

wal_events_table = Table(
    "wal_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("topic", String(255), nullable=False),
    # `metasrv.wire.EventKind`: "wal_data_loss", "purge_started", "purge_deleted", ...
    Column("kind", String(64), nullable=False),
    Column("region_id", BigInteger, nullable=True),
    Column("details", JSON, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    # Migration 0004: what a prune attempt event names (null where it does not apply).
    Column("procedure_id", String(64), nullable=True),
    # P, the offset the purge deletes below and the marker it writes.
    Column("target", BigInteger, nullable=True),
    # Kafka's log start when the purge planned, and after its DeleteRecords.
    Column("log_start_before", BigInteger, nullable=True),
    Column("log_start_after", BigInteger, nullable=True),
    Column("high_watermark", BigInteger, nullable=True),
    # The skip reason, the error of a retry or failure, the outcome of a deletion.
    Column("message", Text, nullable=True),
    Index(None, "topic", "at"),
    Index(None, "kind", "at"),
    # Retention deletes by age, and unfiltered reads are newest first.
    Index(None, "at"),
)

# --- the reconcile job's results (migration 0002), read by GET /v1/reconcile/latest ----

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
