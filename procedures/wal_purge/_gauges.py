"""The per-topic purge gauges, from plans: one writer for the ticker and `/metrics`."""

from __future__ import annotations

import time
from collections.abc import Mapping

from metasrv.metrics import Metrics
from metasrv.model import TopicPlan, TopicStat, retained_entries


def export_gauges(
    metrics: Metrics, plans: Mapping[str, TopicPlan], topic_stats: Mapping[str, TopicStat]
) -> None:
    """Set prune point (-1 when blocked), blocked regions, topic reset (1/0), marker, purge
    lag and Kafka's offsets and retention of every planned topic.

    The purge lag is P minus the marker, a missing marker read as -1 (nothing purged yet);
    a blocked topic has no P and shows a lag of 0. Offsets and retention are set only
    when the plan had Kafka's offsets. Each pinned consumer group gets its lag (when its
    committed offset and the high watermark are known) and whether it blocks the topic.
    """
    metrics.plan_gauges_at = time.monotonic()
    for topic, plan in plans.items():
        p = plan.prune_point
        marker = plan.pruned_entry_id
        metrics.prune_point.labels(topic).set(-1 if p is None else p)
        metrics.blocked_regions.labels(topic).set(len(plan.blocked_by))
        metrics.topic_reset.labels(topic).set(0 if plan.topic_reset is None else 1)
        if marker is not None:
            metrics.pruned_entry_id.labels(topic).set(marker)
        lag = 0 if p is None else max(0, p - (-1 if marker is None else marker))
        metrics.purge_lag_entries.labels(topic).set(lag)
        for group in plan.pinned_groups:
            blocking = group.committed_offset is None
            metrics.pinned_group_blocking.labels(topic, group.group).set(1 if blocking else 0)
            if group.lag is not None:
                metrics.pinned_group_lag.labels(topic, group.group).set(group.lag)
        if plan.log_start_offset is not None and plan.high_watermark is not None:
            retained = retained_entries(plan.log_start_offset, plan.high_watermark)
            metrics.log_start_offset.labels(topic).set(plan.log_start_offset)
            metrics.high_watermark.labels(topic).set(plan.high_watermark)
            metrics.retained_entries.labels(topic).set(retained)
            stat = topic_stats.get(topic)
            if stat is not None:
                metrics.retained_bytes.labels(topic).set(stat.bytes_of(retained))
