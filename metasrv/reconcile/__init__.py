"""The Spark reconcile job: find, and optionally repair, inconsistencies between the
topic-region map, what regions report in heartbeats, and Kafka.

`run_reconcile(settings, RunOptions(...))` is one run end to end (`metasrv reconcile`).
The rules are in `_rules.py`, the Spark pass in `_job.py`, repairs in `_apply.py`.
PySpark loads only when a Spark name is first used (the daemon serves reconcile results
without it).
"""

import importlib
from typing import TYPE_CHECKING, Any

from metasrv.reconcile._apply import (
    HIDES_ENTRIES,
    Action,
    ActionKind,
    ActionResult,
    ApplyPlan,
    Outcome,
    execute_plan,
    plan_actions,
)
from metasrv.reconcile._findings import (
    FINDINGS_SCHEMA,
    MAP_SCHEMA,
    SEVERITY_RANK,
    Finding,
)
from metasrv.reconcile._progress import NullProgress, Progress
from metasrv.reconcile._rules import (
    Coverage,
    ReconcileParams,
    TopicFacts,
    pool_topics,
    registration_hides,
    skew_finding,
    topic_findings,
)
from metasrv.reconcile._run import RunOptions, RunReport, run_reconcile
from metasrv.reconcile._snapshot import KvSnapshot, read_snapshot
from metasrv.reconcile._store import RunRecord, latest_run, save_run
from metasrv.wire import FindingKind, Severity

if TYPE_CHECKING:
    from metasrv.reconcile._job import JobInputs, JobResult, run_job
    from metasrv.reconcile._spark import build_session, check_master_reachable, spark_schema

_SPARK_NAMES = {
    "JobInputs": "_job",
    "JobResult": "_job",
    "run_job": "_job",
    "build_session": "_spark",
    "check_master_reachable": "_spark",
    "spark_schema": "_spark",
}


def __getattr__(name: str) -> Any:
    module = _SPARK_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "FINDINGS_SCHEMA",
    "HIDES_ENTRIES",
    "MAP_SCHEMA",
    "SEVERITY_RANK",
    "Action",
    "ActionKind",
    "ActionResult",
    "ApplyPlan",
    "Coverage",
    "Finding",
    "FindingKind",
    "JobInputs",
    "JobResult",
    "KvSnapshot",
    "NullProgress",
    "Outcome",
    "Progress",
    "ReconcileParams",
    "RunOptions",
    "RunRecord",
    "RunReport",
    "Severity",
    "TopicFacts",
    "build_session",
    "check_master_reachable",
    "execute_plan",
    "latest_run",
    "plan_actions",
    "pool_topics",
    "read_snapshot",
    "registration_hides",
    "run_job",
    "run_reconcile",
    "save_run",
    "skew_finding",
    "spark_schema",
    "topic_findings",
]
