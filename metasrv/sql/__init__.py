"""The SQL schema metasrv's databases hold (kv, election, history, reconcile results), the
start-up check that the schema is migrated, and the URL every engine is opened with.
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
from metasrv.sql._url import engine_url

__all__ = [
    "KV_KEY_MAX",
    "election_table",
    "engine_url",
    "kv_revision_table",
    "kv_table",
    "metadata",
    "procedure_history_table",
    "purge_history_table",
    "reconcile_findings_table",
    "reconcile_runs_table",
    "require_schema",
    "schema_problem",
    "upgrade_command",
    "wal_events_table",
]
