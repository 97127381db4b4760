"""The Spark side of a reconcile run: region-level findings over the map and stat history.

Inputs arrive as Parquet the driver wrote (the kv snapshot) or the leader wrote (the stat
history, metasrv/stat_history/); the small per-topic facts (Kafka offsets, markers, the
pool) travel as driver-side values and are broadcast. The rules are defined in `_rules.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from metasrv.model import PartitionOffsets
from metasrv.reconcile._findings import FINDINGS_SCHEMA, MAP_SCHEMA, SEVERITY_RANK, Finding
from metasrv.reconcile._rules import Coverage, ReconcileParams, TopicFacts, topic_findings
from metasrv.reconcile._spark import spark_schema
from metasrv.stat_history import (
    PARTITION,
    SNAPSHOTS_DIR,
    SNAPSHOTS_SCHEMA,
    STATS_DIR,
    STATS_SCHEMA,
    WRITER,
    hour_partition,
    location_exists,
    spark_location,
)
from metasrv.wire import FindingKind, Severity

logger = logging.getLogger(__name__)

# The Parquet schemas are defined once, in Arrow, by their writers; Spark reads them with
# the same columns (the stat history's hive partition columns come from its paths).
_PARTITIONS = (
    pa.field(PARTITION, pa.int32(), nullable=False),
    pa.field(WRITER, pa.string(), nullable=False),
)
_SPARK_MAP = spark_schema(MAP_SCHEMA)
_SPARK_STATS = spark_schema(STATS_SCHEMA, *_PARTITIONS)
_SPARK_SNAPSHOTS = spark_schema(SNAPSHOTS_SCHEMA, *_PARTITIONS)
_SPARK_FINDINGS = spark_schema(FINDINGS_SCHEMA)
_OFFSETS = T.StructType(
    [
        T.StructField("topic", T.StringType(), False),
        T.StructField("log_start_offset", T.LongType(), False),
        T.StructField("high_watermark", T.LongType(), False),
    ]
)
_REPORTED = T.StructType(
    [
        T.StructField("last_topic", T.StringType(), False),
        T.StructField("u_pruned", T.LongType(), True),
        T.StructField("u_log_start", T.LongType(), True),
    ]
)
_JSON_OPTS = {"ignoreNullFields": "false"}


@dataclass(frozen=True, slots=True)
class JobInputs:
    """Everything one run reads, already fetched or staged by the driver."""

    map_path: str
    """Parquet file or directory of `MAP_SCHEMA` rows (the kv snapshot's region map)."""
    history_dir: str
    """The cluster's stat history root, a path or URL (`metasrv.stat_history.cluster_root`);
    the executors read it, so on a cluster it must be on storage they all reach."""
    markers: Mapping[str, int | None]
    """Topic markers: topic -> `pruned_entry_id` (kv `__topic_name/kafka/...`)."""
    kafka_topics: frozenset[str]
    """Every topic Kafka has."""
    offsets: Mapping[str, PartitionOffsets]
    """Partition-0 offsets of the Kafka topics that matter (mapped, pool, prefix)."""
    pool: tuple[str, ...]
    """The configured topic pool."""
    prefix: str
    """The pool's topic name prefix."""


@dataclass(frozen=True, slots=True)
class JobResult:
    """What the Spark pass produced."""

    findings_path: str
    """Directory of the findings Parquet (`FINDINGS_SCHEMA`)."""
    counts: dict[str, dict[str, int]]
    """kind -> severity -> number of findings."""
    coverage: Coverage
    """Span of the stat history read."""
    mapped_pairs: int
    """(region, topic) mappings in the snapshot."""
    mapped_topics: int
    """Topics with at least one mapped region."""
    regions_reporting: int
    """Regions with at least one stat in the window."""
    notes: list[str] = field(default_factory=list)
    """Checks skipped or limited, and why."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: coverage, aggregate (history + join + per-topic), write, count."""


def read_stats(spark: SparkSession, history_dir: str, params: ReconcileParams) -> DataFrame:
    """Stat rows in the window, with `seen_ms` (epoch ms); empty when there is no history."""
    root = f"{history_dir.rstrip('/')}/{STATS_DIR}"
    if not location_exists(root):
        df = spark.createDataFrame([], _SPARK_STATS)
    else:
        root = spark_location(root)
        df = spark.read.schema(_SPARK_STATS).option("basePath", root).parquet(root)
    lo = hour_partition(params.window_start)
    return (
        df.where(F.col(PARTITION) >= lo)
        .where(F.unix_millis("ts") <= params.now_ms)
        .where(F.unix_millis("ts") >= int(params.window_start * 1000))
        .select(
            "region_id",
            "node_id",
            "topic",
            "prunable_entry_id",
            F.unix_millis("seen_at").alias("seen_ms"),
        )
    )


def read_coverage(spark: SparkSession, history_dir: str, params: ReconcileParams) -> Coverage:
    """Oldest and newest snapshot in the window."""
    root = f"{history_dir.rstrip('/')}/{SNAPSHOTS_DIR}"
    if not location_exists(root):
        return Coverage(None, None, 0)
    root = spark_location(root)
    df = spark.read.schema(_SPARK_SNAPSHOTS).option("basePath", root).parquet(root)
    ms = F.unix_millis("ts")
    row = (
        df.where(F.col(PARTITION) >= hour_partition(params.window_start))
        .where((ms <= params.now_ms) & (ms >= int(params.window_start * 1000)))
        .agg(F.min(ms).alias("lo"), F.max(ms).alias("hi"), F.count(F.lit(1)).alias("n"))
        .collect()[0]
    )
    return Coverage(row["lo"], row["hi"], int(row["n"]))


def latest_stats(stats: DataFrame) -> DataFrame:
    """One row per region: its latest stat (by receive time) and the time of it.

    `max` over a struct orders by its fields in turn: the latest `seen_ms` wins, ties go
    to the higher prunable id, so the result is deterministic. Measured on 10M rows this
    beats `max_by` per column and a hash-of-topic dictionary by 2-4x.
    """
    latest = stats.groupBy("region_id").agg(
        F.max(F.struct("seen_ms", "prunable_entry_id", "node_id", "topic")).alias("s")
    )
    return latest.select(
        "region_id",
        F.col("s.seen_ms").alias("last_seen_ms"),
        F.col("s.prunable_entry_id").alias("last_prunable"),
        F.col("s.node_id").alias("last_node_id"),
        F.col("s.topic").alias("last_topic"),
    )


def _finding(
    kind: FindingKind, severity: Severity | Column, topic: Column, message: Column, **ev: Column
) -> list[Column]:
    sev = severity if isinstance(severity, Column) else F.lit(severity.value)
    return [
        F.lit(kind.value).alias("kind"),
        sev.alias("severity"),
        topic.alias("topic"),
        F.col("region_id").alias("region_id"),
        message.alias("message"),
        F.to_json(F.struct(*[c.alias(k) for k, c in ev.items()]), _JSON_OPTS).alias("evidence"),
    ]


def region_findings(
    joined: DataFrame,
    offsets: DataFrame,
    params: ReconcileParams,
    coverage: Coverage,
    reported: DataFrame,
) -> tuple[DataFrame, list[str]]:
    """Stale, mismatch, unmapped and retention-overrun findings from the joined frame
    (`reported`: each topic's marker and log start, by `last_topic`)."""
    col = F.col
    notes: list[str] = []
    now_ms, cutoff = params.now_ms, params.stale_cutoff_ms
    judge, judge_unseen, note = coverage.stale_check(params)
    if note:
        notes.append(note)
    pairs = joined.where(col("topic").isNotNull())
    parts: list[DataFrame] = []

    if judge:
        seen_old = col("last_seen_ms").isNotNull() & (col("last_seen_ms") < cutoff)
        unseen = col("last_seen_ms").isNull() & F.lit(judge_unseen)
        unseen_for = (
            F.lit((now_ms - coverage.start_ms) // 1000)
            if coverage.start_ms is not None
            else F.lit(None).cast("long")
        )
        age = F.floor((F.lit(now_ms) - col("last_seen_ms")) / 1000).cast("long")
        parts.append(
            pairs.where(seen_old | unseen).select(
                *_finding(
                    FindingKind.STALE_REGION,
                    Severity.WARNING,
                    col("topic"),
                    F.when(
                        col("last_seen_ms").isNull(),
                        F.format_string(
                            "region %d on %s has no stat in the history: it blocks purging",
                            col("region_id"),
                            col("topic"),
                        ),
                    ).otherwise(
                        F.format_string(
                            "region %d on %s has had no stat for %ds: it blocks purging",
                            col("region_id"),
                            col("topic"),
                            age,
                        )
                    ),
                    node_id=col("node_id"),
                    last_seen_ms=col("last_seen_ms"),
                    age_s=F.when(col("last_seen_ms").isNotNull(), age),
                    unseen_for_at_least_s=F.when(col("last_seen_ms").isNull(), unseen_for),
                    stale_after_s=F.lit(int(params.stale_after)),
                    checkpoint_entry_id=col("checkpoint_entry_id"),
                )
            )
        )

    parts.append(
        pairs.where(col("last_topic").isNotNull() & (col("last_topic") != col("topic"))).select(
            *_finding(
                FindingKind.TOPIC_MISMATCH,
                Severity.CRITICAL,
                col("topic"),
                F.format_string(
                    "region %d is mapped to %s but reports %s",
                    col("region_id"),
                    col("topic"),
                    col("last_topic"),
                ),
                reported_topic=col("last_topic"),
                node_id=col("node_id"),
                reported_node_id=col("last_node_id"),
                last_seen_ms=col("last_seen_ms"),
            )
        )
    )

    # An unmapped region whose entries lie at or below its topic's marker, or below
    # Kafka's log start, is WAL data loss: registering it would hide that
    # (`_rules.registration_hides`, which the apply planner checks again).
    unmapped = joined.where(col("topic").isNull() & (col("last_seen_ms") >= cutoff))
    unmapped = unmapped.join(F.broadcast(reported), "last_topic", "left")
    prunable, pruned, log_start = col("last_prunable"), col("u_pruned"), col("u_log_start")
    hidden = (
        prunable.isNull()
        | (pruned.isNotNull() & (prunable < pruned))
        | (log_start.isNotNull() & (log_start > prunable + 1))
    )
    parts.append(
        unmapped.select(
            *_finding(
                FindingKind.UNMAPPED_REGION,
                F.when(hidden, F.lit(Severity.CRITICAL.value)).otherwise(Severity.WARNING.value),
                col("last_topic"),
                F.format_string(
                    "%sregion %d reports heartbeats on %s but is not in the topic-region map%s",
                    F.when(hidden, F.lit("WAL data loss: ")).otherwise(""),
                    col("region_id"),
                    col("last_topic"),
                    F.when(
                        hidden,
                        F.format_string(
                            ", and needs entries from %d: at or below the topic's marker, or "
                            "below Kafka's log start (not registered automatically)",
                            prunable + 1,
                        ),
                    ).otherwise(""),
                ),
                node_id=col("last_node_id"),
                last_seen_ms=col("last_seen_ms"),
                age_s=F.floor((F.lit(now_ms) - col("last_seen_ms")) / 1000).cast("long"),
                prunable_entry_id=prunable,
                pruned_entry_id=pruned,
                log_start_offset=log_start,
                wal_data_loss=hidden,
            )
        )
    )

    stat_progress = F.when(col("last_topic") == col("topic"), col("last_prunable"))
    progress = F.greatest(stat_progress, col("checkpoint_entry_id"))
    overrun = (
        pairs.join(F.broadcast(offsets), "topic")
        .withColumn("progress", progress)
        .where(col("progress").isNotNull() & (col("log_start_offset") > col("progress") + 1))
    )
    parts.append(
        overrun.select(
            *_finding(
                FindingKind.RETENTION_OVERRUN,
                Severity.CRITICAL,
                col("topic"),
                F.format_string(
                    "WAL data loss: %s starts at offset %d but region %d needs entries from %d",
                    col("topic"),
                    col("log_start_offset"),
                    col("region_id"),
                    col("progress") + 1,
                ),
                log_start_offset=col("log_start_offset"),
                high_watermark=col("high_watermark"),
                prunable_entry_id=col("progress"),
                source=F.when(
                    stat_progress.isNotNull()
                    & (
                        col("checkpoint_entry_id").isNull()
                        | (stat_progress >= col("checkpoint_entry_id"))
                    ),
                    F.lit("stat"),
                ).otherwise(F.lit("checkpoint")),
                missing_entries=col("log_start_offset") - col("progress") - 1,
                node_id=col("node_id"),
            )
        )
    )
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out, notes


def run_job(
    spark: SparkSession,
    inputs: JobInputs,
    params: ReconcileParams,
    findings_path: str,
) -> JobResult:
    """Compute every finding, write them as Parquet to `findings_path`, count them."""
    col = F.col
    timings: dict[str, float] = {}
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        timings[name] = round(now - mark, 3)
        mark = now

    coverage = read_coverage(spark, inputs.history_dir, params)
    lap("coverage")
    mapped = spark.read.schema(_SPARK_MAP).parquet(inputs.map_path)
    latest = latest_stats(read_stats(spark, inputs.history_dir, params))
    joined = mapped.join(latest, "region_id", "full_outer").persist()
    try:
        progress = F.greatest(
            F.when(col("last_topic") == col("topic"), col("last_prunable")),
            col("checkpoint_entry_id"),
        )
        per_topic = (
            joined.groupBy("topic")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.max(progress).alias("max_progress"),
                F.count("last_seen_ms").alias("reporting"),
            )
            .collect()
        )
        lap("aggregate")
        facts: dict[str, TopicFacts] = {}
        mapped_pairs = regions_reporting = 0
        for row in per_topic:
            regions_reporting += int(row["reporting"])
            if row["topic"] is None:
                continue
            mapped_pairs += int(row["n"])
            facts[row["topic"]] = TopicFacts(int(row["n"]), row["max_progress"])
        offsets = spark.createDataFrame(
            [(t, o.log_start_offset, o.high_watermark) for t, o in sorted(inputs.offsets.items())],
            _OFFSETS,
        )
        reported = spark.createDataFrame(
            [
                (
                    t,
                    inputs.markers.get(t),
                    o.log_start_offset if (o := inputs.offsets.get(t)) else None,
                )
                for t in sorted(set(inputs.markers) | set(inputs.offsets))
            ],
            _REPORTED,
        )
        regional, notes = region_findings(joined, offsets, params, coverage, reported)
        per_topic_findings = topic_findings(
            facts=facts,
            markers=inputs.markers,
            kafka_topics=inputs.kafka_topics,
            offsets=inputs.offsets,
            pool=inputs.pool,
            prefix=inputs.prefix,
            skew_tolerance=params.skew_tolerance,
        )
        small = spark.createDataFrame([_row_tuple(f) for f in per_topic_findings], _SPARK_FINDINGS)
        rank = F.create_map(
            *[x for s, r in SEVERITY_RANK.items() for x in (F.lit(s.value), F.lit(r))]
        )
        everything = regional.unionByName(small)
        # Sorted so readers (the SQL export, the API) can take the most urgent first.
        (
            everything.repartition(1)
            .sortWithinPartitions(rank[col("severity")], "kind", "topic", "region_id")
            .write.mode("overwrite")
            .parquet(findings_path)
        )
        lap("write")
    finally:
        joined.unpersist()
    counts: dict[str, dict[str, int]] = {}
    for row in spark.read.parquet(findings_path).groupBy("kind", "severity").count().collect():
        counts.setdefault(row["kind"], {})[row["severity"]] = int(row["count"])
    lap("count")
    return JobResult(
        findings_path=findings_path,
        counts=counts,
        coverage=coverage,
        mapped_pairs=mapped_pairs,
        mapped_topics=len(facts),
        regions_reporting=regions_reporting,
        notes=notes,
        timings=timings,
    )


def _row_tuple(f: Finding) -> tuple[Any, ...]:
    row = f.to_row()
    return tuple(row[name] for name in _SPARK_FINDINGS.fieldNames())
