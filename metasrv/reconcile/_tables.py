"""The reconcile job's result tables; defined in metasrv/sql/_schema.py with every other
table (so importing the schema never imports Spark), re-exported here for the job."""

from metasrv.sql import reconcile_findings_table, reconcile_runs_table

__all__ = ["reconcile_findings_table", "reconcile_runs_table"]
