"""The reconcile findings computed in one process with pyarrow: the benchmark's baseline.

Same rules as the Spark job (metasrv/reconcile/_rules.py documents them) and the same
evidence, so `reconcile_bench.py` can check both engines agree finding for finding.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from metasrv.model import PartitionOffsets
from metasrv.reconcile import (
    Coverage,
    Finding,
    FindingKind,
    JobInputs,
    ReconcileParams,
    Severity,
    TopicFacts,
    topic_findings,
)
from metasrv.stat_history import PARTITION, SNAPSHOTS_DIR, STATS_DIR, hour_partition


def _window(root: str, params: ReconcileParams, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(root, format="parquet", partitioning="hive")
    ts = pc.field("ts").cast(pa.int64())
    flt = (
        (pc.field(PARTITION) >= hour_partition(params.window_start))
        & (ts <= params.now_ms)
        & (ts >= int(params.window_start * 1000))
    )
    return dataset.to_table(columns=columns, filter=flt)


def _coverage(history_dir: str, params: ReconcileParams) -> Coverage:
    snaps = _window(f"{history_dir}/{SNAPSHOTS_DIR}", params, ["ts"])
    if snaps.num_rows == 0:
        return Coverage(None, None, 0)
    ms = snaps["ts"].cast(pa.int64())
    return Coverage(pc.min(ms).as_py(), pc.max(ms).as_py(), snaps.num_rows)


def _latest(history_dir: str, params: ReconcileParams) -> pa.Table:
    stats = _window(
        f"{history_dir}/{STATS_DIR}",
        params,
        ["region_id", "node_id", "topic", "prunable_entry_id", "seen_at"],
    )
    stats = stats.append_column("seen_ms", stats["seen_at"].cast(pa.int64())).drop_columns(
        ["seen_at"]
    )
    # Same order as the Spark job's max(struct(seen_ms, prunable, node, topic)).
    ordered = stats.sort_by(
        [
            (name, "ascending")
            for name in ("region_id", "seen_ms", "prunable_entry_id", "node_id", "topic")
        ]
    )
    latest = ordered.group_by("region_id", use_threads=False).aggregate(
        [
            ("seen_ms", "max"),
            ("prunable_entry_id", "last"),
            ("node_id", "last"),
            ("topic", "last"),
        ]
    )
    return latest.rename_columns(
        ["region_id", "last_seen_ms", "last_prunable", "last_node_id", "last_topic"]
    )


def baseline_findings(
    inputs: JobInputs, params: ReconcileParams
) -> tuple[list[Finding], Mapping[str, TopicFacts]]:
    """Every finding the Spark job would report for `inputs`, in one process."""
    coverage = _coverage(inputs.history_dir, params)
    mapped = pq.read_table(inputs.map_path)
    latest = _latest(inputs.history_dir, params)
    joined = mapped.join(latest, keys="region_id", join_type="full outer")
    rows = joined.to_pylist()
    now_ms, cutoff = params.now_ms, params.stale_cutoff_ms
    judge, judge_unseen, _ = coverage.stale_check(params)
    offsets: Mapping[str, PartitionOffsets] = inputs.offsets
    found: list[Finding] = []
    facts: dict[str, list[int | None]] = {}
    for r in rows:
        topic, seen, last_topic = r["topic"], r["last_seen_ms"], r["last_topic"]
        rid = r["region_id"]
        if topic is None:
            if seen is not None and seen >= cutoff:
                found.append(
                    Finding(
                        FindingKind.UNMAPPED_REGION,
                        Severity.WARNING,
                        last_topic,
                        rid,
                        "",
                        {
                            "node_id": r["last_node_id"],
                            "last_seen_ms": seen,
                            "age_s": (now_ms - seen) // 1000,
                            "prunable_entry_id": r["last_prunable"],
                        },
                    )
                )
            continue
        stat_progress = r["last_prunable"] if last_topic == topic else None
        known = [v for v in (stat_progress, r["checkpoint_entry_id"]) if v is not None]
        progress = max(known) if known else None
        fact = facts.setdefault(topic, [0, None])
        fact[0] = (fact[0] or 0) + 1
        if progress is not None and (fact[1] is None or progress > fact[1]):
            fact[1] = progress
        if judge and ((seen is not None and seen < cutoff) or (seen is None and judge_unseen)):
            found.append(
                Finding(
                    FindingKind.STALE_REGION,
                    Severity.WARNING,
                    topic,
                    rid,
                    "",
                    {
                        "node_id": r["node_id"],
                        "last_seen_ms": seen,
                        "age_s": None if seen is None else (now_ms - seen) // 1000,
                        "unseen_for_at_least_s": (
                            (now_ms - coverage.start_ms) // 1000
                            if seen is None and coverage.start_ms is not None
                            else None
                        ),
                        "stale_after_s": int(params.stale_after),
                        "checkpoint_entry_id": r["checkpoint_entry_id"],
                    },
                )
            )
        if last_topic is not None and last_topic != topic:
            found.append(
                Finding(
                    FindingKind.TOPIC_MISMATCH,
                    Severity.CRITICAL,
                    topic,
                    rid,
                    "",
                    {
                        "reported_topic": last_topic,
                        "node_id": r["node_id"],
                        "reported_node_id": r["last_node_id"],
                        "last_seen_ms": seen,
                    },
                )
            )
        off = offsets.get(topic)
        if off is not None and progress is not None and off.log_start_offset > progress + 1:
            ckpt = r["checkpoint_entry_id"]
            found.append(
                Finding(
                    FindingKind.RETENTION_OVERRUN,
                    Severity.CRITICAL,
                    topic,
                    rid,
                    "",
                    {
                        "log_start_offset": off.log_start_offset,
                        "high_watermark": off.high_watermark,
                        "prunable_entry_id": progress,
                        "source": (
                            "stat"
                            if stat_progress is not None and (ckpt is None or stat_progress >= ckpt)
                            else "checkpoint"
                        ),
                        "missing_entries": off.log_start_offset - progress - 1,
                        "node_id": r["node_id"],
                    },
                )
            )
    topic_facts = {t: TopicFacts(int(n or 0), p) for t, (n, p) in facts.items()}
    found.extend(
        topic_findings(
            facts=topic_facts,
            markers=inputs.markers,
            kafka_topics=inputs.kafka_topics,
            offsets=inputs.offsets,
            pool=inputs.pool,
            prefix=inputs.prefix,
            skew_tolerance=params.skew_tolerance,
        )
    )
    return found, topic_facts
