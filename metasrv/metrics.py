"""Prometheus metrics of one metasrv process.

Each `Metrics` owns its own `CollectorRegistry`, so several apps in one test process do
not collide. Names follow GreptimeDB's `greptime_meta_*` style and Kafka tiered
storage's per-topic gauges; per-topic series carry the `topic` label.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    """Every series metasrv exports. Build one per app (the lifespan does)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.plan_gauges_at = float("-inf")
        """When the per-topic plan gauges were last set (`time.monotonic()`)."""
        self.plan_gauges_cost = 0.0
        """Seconds the last scrape's planning for them took (`api.queries.refresh_metrics`)."""
        r = self.registry
        self.pruned_entry_id = Gauge(
            "metasrv_wal_pruned_entry_id", "P of the last completed purge", ["topic"], registry=r
        )
        self.prune_point = Gauge(
            "metasrv_wal_prune_point",
            "Current prune point P (-1 when blocked)",
            ["topic"],
            registry=r,
        )
        self.purge_lag_entries = Gauge(
            "metasrv_wal_purge_lag_entries",
            "Prune point minus pruned entry id",
            ["topic"],
            registry=r,
        )
        self.retained_entries = Gauge(
            "metasrv_wal_retained_entries",
            "Entries Kafka holds for the topic (high watermark - log start offset)",
            ["topic"],
            registry=r,
        )
        self.retained_bytes = Gauge(
            "metasrv_wal_retained_bytes_estimated",
            "Retained entries times the average record size",
            ["topic"],
            registry=r,
        )
        self.log_start_offset = Gauge(
            "metasrv_wal_log_start_offset", "Kafka log start offset", ["topic"], registry=r
        )
        self.high_watermark = Gauge(
            "metasrv_wal_high_watermark", "Kafka high watermark", ["topic"], registry=r
        )
        self.blocked_regions = Gauge(
            "metasrv_wal_blocked_regions",
            "Regions blocking the topic's purge",
            ["topic"],
            registry=r,
        )
        self.pinned_group_lag = Gauge(
            "metasrv_wal_pinned_group_lag",
            "Entries a pinned consumer group has still to read on the topic (high watermark - "
            "its committed offset); its committed offset bounds every purge of the topic",
            ["topic", "group"],
            registry=r,
        )
        self.pinned_group_blocking = Gauge(
            "metasrv_wal_pinned_group_blocking",
            "1 while a pinned consumer group has no committed offset on the topic (nothing is "
            "purged from it), else 0",
            ["topic", "group"],
            registry=r,
        )
        self.purges = Counter("metasrv_wal_purges", "Completed purges", ["topic"], registry=r)
        self.purge_errors = Counter(
            "metasrv_wal_purge_errors", "Purge step failures", ["topic", "kind"], registry=r
        )
        self.entries_deleted = Counter(
            "metasrv_wal_entries_deleted", "Entries deleted by purges", ["topic"], registry=r
        )
        self.flush_instructions = Counter(
            "metasrv_flush_instructions_sent", "flush_regions instructions issued", registry=r
        )
        self.heartbeats = Counter("metasrv_heartbeats_received", "Heartbeats accepted", registry=r)
        self.region_stats = Counter(
            "metasrv_region_stats_received", "Region stats accepted", registry=r
        )
        self.region_stats_rejected = Counter(
            "metasrv_region_stats_rejected", "Region stats rejected", ["reason"], registry=r
        )
        self.idle_claims_ignored = Counter(
            "metasrv_idle_claims_ignored",
            "Region stats whose topic_latest_entry_id came with a non-empty memtable (not used)",
            registry=r,
        )
        self.topic_reports_ignored = Counter(
            "metasrv_topic_reports_ignored",
            "Heartbeat topic reports for topics not in the topic-region map (not stored)",
            registry=r,
        )
        self.event_loop_lag = Histogram(
            "metasrv_event_loop_lag_seconds",
            "How late the event loop ran a periodic probe (time other work held the loop)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.procedure_duration = Histogram(
            "metasrv_procedure_duration_seconds",
            "Procedure wall time, submit to terminal state",
            ["kind", "state"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.procedures_running = Gauge(
            "metasrv_procedures_running", "Procedures currently running", registry=r
        )
        self.is_leader = Gauge("metasrv_is_leader", "1 when this process is leader", registry=r)
        self.wal_data_loss = Counter(
            "metasrv_wal_data_loss_events",
            "Retention overruns: Kafka deleted entries a region still needed",
            ["topic"],
            registry=r,
        )
        self.topic_resets = Counter(
            "metasrv_wal_topic_resets",
            "Topic resets found (DESIGN invariant 8: the topic's offsets went backwards under "
            "metasrv, e.g. deleted and recreated): WAL data loss, latched in the marker",
            ["topic"],
            registry=r,
        )
        self.archive_blocked = Gauge(
            "metasrv_wal_archive_blocked",
            "1 while the topic's last purge deleted nothing because the WAL archive's bucket "
            "did not hold [log start, target) with no gap, or did not answer (DESIGN §8), "
            "else 0",
            ["topic"],
            registry=r,
        )
        self.topic_reset = Gauge(
            "metasrv_wal_topic_reset",
            "1 while the topic is a topic reset (nothing is deleted from it until an operator "
            "resolves it), else 0",
            ["topic"],
            registry=r,
        )
        self.wal_events_dropped = Counter(
            "metasrv_wal_events_dropped",
            "WAL events not written to the history database (write_failed, overflow)",
            ["reason"],
            registry=r,
        )
        self.background_task_errors = Counter(
            "metasrv_background_task_errors",
            "Failed rounds (and deaths) of background tasks; each keeps running",
            ["task"],
            registry=r,
        )
        self.checkpoint_writes = Counter(
            "metasrv_checkpoint_keys_written", "Region checkpoints persisted", registry=r
        )

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
