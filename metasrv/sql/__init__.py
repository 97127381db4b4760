"""The SQL schema metasrv's databases hold (kv, election, history, reconcile results), the
start-up check that the schema is migrated, the URL every engine is opened with, and
which URLs are the embedded SQLite default (migrated on open).
"""

from metasrv.sql._check import require_schema, schema_problem, upgrade_command
from metasrv.sql._schema import (
    KV_KEY_MAX,
    election_table,
    kv_revision_table,
    kv_table,
    metadata,
    procedure_history_table,
    purge_history_table,
    reconcile_findings_table,
    reconcile_runs_table,
    wal_events_table,
)
from metasrv.sql._url import (
    engine_url,
    is_memory_sqlite,
    is_sqlite,
    migrate_embedded,
    sqlite_file,
)

__all__ = [
    "KV_KEY_MAX",
    "election_table",
    "engine_url",
    "is_memory_sqlite",
    "is_sqlite",
    "kv_revision_table",
    "kv_table",
    "metadata",
    "migrate_embedded",
    "procedure_history_table",
    "purge_history_table",
    "reconcile_findings_table",
    "reconcile_runs_table",
    "require_schema",
    "schema_problem",
    "sqlite_file",
    "upgrade_command",
    "wal_events_table",
]
