"""One reconcile run end to end: snapshot, Kafka, Spark, outputs, optional apply.

The stages are reported through `_progress.py`; what the run saves in the history database
is `_outputs.py`'s.

Output layout under `out_dir` (a local or shared path the driver can read):

    {run_id}/input/map.parquet     the kv snapshot's topic-region map (Spark's input)
    {run_id}/findings/             findings Parquet (FINDINGS_SCHEMA), most urgent first
    {run_id}/summary.json          counts, inputs, coverage, notes, timings, apply results

and the run plus its most urgent findings in the `reconcile_runs` / `reconcile_findings`
tables of the history database (`[history] url`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from metasrv.errors import ConfigError, KafkaUnavailable, Unavailable
from metasrv.model import PartitionOffsets
from metasrv.reconcile._apply import (
    ActionResult,
    ApplyPlan,
    Outcome,
    RegionApi,
    execute_plan,
    plan_actions,
)
from metasrv.reconcile._findings import Finding
from metasrv.reconcile._outputs import apply_summary, save_to_history
from metasrv.reconcile._progress import NullProgress, Progress, StageTimer, watch_spark
from metasrv.reconcile._rules import ReconcileParams, pool_topics
from metasrv.reconcile._snapshot import KvSnapshot, read_snapshot
from metasrv.settings import Settings
from metasrv.stat_history import cluster_root
from metasrv.wire import FindingKind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from metasrv.kafka import KafkaAdmin
    from metasrv.kv import KvBackend

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What the caller asked for (CLI flags over configuration)."""

    master: str
    """Spark master URL."""
    out_dir: Path
    """Directory receiving one sub-directory per run."""
    apply: bool = False
    """Repair the safe classes of findings."""
    drop_stale_after: float | None = None
    """Seconds; with `apply`, drop regions stale for at least this long."""
    now: float | None = None
    """Judge against this wall-clock time instead of the current one (tests)."""


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a finished run produced."""

    run_id: str
    """Unique id of the run."""
    run_dir: Path
    """Its output directory."""
    summary: dict[str, Any]
    """The JSON summary (also written to `run_dir/summary.json`)."""
    actions: list[ActionResult] = field(default_factory=list)
    """What `--apply` did, in order."""

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """kind -> severity -> findings."""
        counts: dict[str, dict[str, int]] = self.summary["counts"]
        return counts

    @property
    def changes(self) -> int:
        """Actions that changed something."""
        return sum(1 for r in self.actions if r.outcome is Outcome.DONE)

    @property
    def failed_actions(self) -> int:
        """Actions the API or Kafka refused."""
        return sum(1 for r in self.actions if r.outcome is Outcome.FAILED)


def _new_run_id(now: float) -> str:
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{uuid.uuid4().hex[:6]}"


def _operator_token(settings: Settings) -> str | None:
    cfg = settings.reconcile
    if cfg.operator_token:
        return cfg.operator_token
    return settings.auth.operator_tokens[0] if settings.auth.operator_tokens else None


def _metasrv_url(settings: Settings) -> str:
    from metasrv.wire import base_url_from_addr

    return settings.reconcile.metasrv_url or base_url_from_addr(settings.http.addr)


def _kafka_facts(
    kafka: KafkaAdmin, settings: Settings, snap: KvSnapshot, pool: list[str]
) -> tuple[frozenset[str], dict[str, PartitionOffsets]]:
    bootstrap = ",".join(settings.wal.broker_endpoints)
    try:
        existing = frozenset(kafka.list_topics())
        prefix = f"{settings.wal.topic_name_prefix}_"
        wanted = set(pool) | set(snap.map_topics) | set(snap.markers)
        wanted |= {t for t in existing if t.startswith(prefix)}
        offsets = kafka.offsets(sorted(wanted & existing))
    except KafkaUnavailable as exc:
        raise KafkaUnavailable(f"Kafka at {bootstrap} unreachable: {exc.message}") from exc
    return existing, offsets


def _fixable(findings_path: str, with_stale: bool) -> list[Finding]:
    kinds = [FindingKind.MISSING_TOPIC.value, FindingKind.UNMAPPED_REGION.value]
    if with_stale:
        kinds.append(FindingKind.STALE_REGION.value)
    table = ds.dataset(findings_path, format="parquet").to_table(
        filter=pc.field("kind").isin(kinds)
    )
    return [Finding.from_row(r) for r in table.to_pylist()]


def run_reconcile(
    settings: Settings,
    options: RunOptions,
    *,
    progress: Progress | None = None,
    spark: SparkSession | None = None,
    kv: KvBackend | None = None,
    kafka: KafkaAdmin | None = None,
    api: RegionApi | None = None,
) -> RunReport:
    """Run the job once. Parts not given are built from `settings` (and closed after).

    Raises `Unavailable` subclasses naming the kv backend, Kafka, the Spark master or
    metasrv when one cannot be reached, `ConfigError` for an unusable configuration.
    """
    progress = progress or NullProgress()
    timer = StageTimer(progress)
    cfg = settings.reconcile
    now = options.now if options.now is not None else time.time()
    started = datetime.now(UTC)
    run_id = _new_run_id(now)
    run_dir = options.out_dir / run_id
    token = _operator_token(settings)
    if options.apply and api is None and token is None:
        raise ConfigError(
            "--apply needs an operator token: set [reconcile] operator_token or "
            "[auth] operator_tokens (or METASRV_RECONCILE__OPERATOR_TOKEN)"
        )
    params = ReconcileParams(
        now=now,
        stale_after=cfg.stale_after,
        history_window=max(cfg.history_window, cfg.stale_after, options.drop_stale_after or 0.0),
        skew_tolerance=cfg.skew_tolerance,
    )
    pool = pool_topics(settings.wal.topic_name_prefix, settings.wal.num_topics)
    history_dir = cluster_root(settings)
    closers: list[Any] = []
    try:
        with timer.stage("kv_snapshot", f"Reading the kv snapshot ({settings.kv.backend})"):
            if kv is None:
                from metasrv.kv import open_kv

                owned = open_kv(settings)
                try:
                    snap = read_snapshot(owned, run_dir / "input" / "map.parquet", progress.advance)
                finally:
                    # Only the snapshot needs the kv store: its client (gRPC for etcd) is
                    # closed before the Spark JVM is forked.
                    owned.close()
            else:
                snap = read_snapshot(kv, run_dir / "input" / "map.parquet", progress.advance)
        with timer.stage("kafka", "Reading Kafka topics and offsets"):
            if kafka is None:
                from metasrv.kafka import KafkaAdmin

                kafka = KafkaAdmin.from_settings(settings.wal)
                closers.append(kafka)
            kafka_topics, offsets = _kafka_facts(kafka, settings, snap, pool)
        with timer.stage("spark_start", f"Starting Spark ({options.master})"):
            from metasrv.reconcile._job import JobInputs, run_job
            from metasrv.reconcile._spark import build_session

            if spark is None:
                spark = build_session(options.master, driver_memory=cfg.driver_memory)
        with timer.stage("spark_job", "Computing findings on Spark"):
            inputs = JobInputs(
                map_path=snap.map_path,
                history_dir=history_dir,
                markers=snap.markers,
                kafka_topics=kafka_topics,
                offsets=offsets,
                pool=tuple(pool),
                prefix=settings.wal.topic_name_prefix,
            )
            with watch_spark(spark, progress):
                result = run_job(spark, inputs, params, str(run_dir / "findings"))
        total = sum(n for by_sev in result.counts.values() for n in by_sev.values())
        plan: ApplyPlan | None = None
        results: list[ActionResult] = []
        apply_error: str | None = None
        if options.apply:
            fixable = _fixable(result.findings_path, options.drop_stale_after is not None)
            plan = plan_actions(
                fixable, kafka_topics=kafka_topics, drop_stale_after=options.drop_stale_after
            )
            with timer.stage("apply", "Applying safe repairs", len(plan.actions)):
                if api is None:
                    from metasrv.wire import MetasrvClient

                    client = MetasrvClient(_metasrv_url(settings), token=token)
                    closers.append(client)
                    api = client
                try:
                    results = execute_plan(
                        plan,
                        api,
                        kafka,
                        replication_factor=settings.wal.replication_factor,
                        topic_config=settings.wal.topic_creation_config(),
                        on_done=lambda r: progress.advance(1),
                        collect=results,
                    )
                except Unavailable as exc:
                    apply_error = exc.message
        summary: dict[str, Any] = {
            "run_id": run_id,
            "started_at": started.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "now": now,
            "master": options.master,
            "applied": options.apply,
            "counts": result.counts,
            "findings_total": total,
            "inputs": {
                "kv_backend": settings.kv.backend,
                "kv_revision": snap.revision,
                "mapped_regions": snap.regions,
                "mapped_topics": len(snap.map_topics),
                "topic_markers": len(snap.markers),
                "malformed_keys": snap.malformed,
                "kafka_topics": len(kafka_topics),
                "pool_size": len(pool),
                "regions_reporting": result.regions_reporting,
                "stat_history": history_dir,
                "history_coverage_ms": [result.coverage.start_ms, result.coverage.end_ms],
                "history_snapshots": result.coverage.snapshots,
            },
            "params": {
                "stale_after_s": params.stale_after,
                "history_window_s": params.history_window,
                "skew_tolerance": params.skew_tolerance,
                "drop_stale_after_s": options.drop_stale_after,
            },
            "notes": result.notes,
            "findings_path": result.findings_path,
            "timings_s": timer.timings,
            "spark_phases_s": result.timings,
        }
        if plan is not None:
            summary["apply"] = apply_summary(plan, results)
            if apply_error:
                summary["apply"]["error"] = apply_error
        with timer.stage("save", "Writing the summary and the SQL tables"):
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
            save_to_history(settings, run_id, started, summary, result.findings_path, results)
        summary["timings_s"] = timer.timings
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        if apply_error:
            raise Unavailable(f"findings saved in {run_dir}, but --apply stopped: {apply_error}")
        return RunReport(run_id, run_dir, summary, results)
    finally:
        for closer in reversed(closers):
            closer.close()
