"""The WAL purge: where each topic may be cut, and the procedure that cuts it.

How one purge decision flows, module by module:

- `_plan.py`: the pure planner and every decision of the purge. P(topic) = min over
  every mapped region of max(prunable_entry_id, marker), at most Kafka's high
  watermark - 1, or None when a region blocks it (no stat, stale stat, WAL data loss)
  or the topic is a reset (invariant 8), bounded by every pinned consumer group's
  committed offset (DESIGN §8). P is exactly where a purge cuts and what the
  marker becomes: the dry run and the purge agree. Each step's decision is a pure
  function of one snapshot (`decide_prepare`, `decide_after_flush`, `decide_purge`,
  `flush_deadline`, `reset_marker`, `advanced_marker`), returning a frozen value
  (`Skip`, `Lost`, `Reset`, `Flush`, `Cut`, `Wait`, `Advance`, `CatchUp`).
- `_inputs.py`: gathers the plan's inputs at one instant (map, stats, marker, offsets,
  the pinned groups' committed offsets) for every reader: the procedure, the ticker and
  the API's plan and metrics; and the regions worth asking to flush (`flush_targets`).
- `_procedure.py`: `WalPurge`, prepare -> flush -> purge under the topic's write lock,
  its persisted data in `_data.py`; `_submit.py` starts one per topic (`submit_purges`)
  on a manager that runs them.
- `_deletion.py`: DeleteRecords below the target, Kafka's log start as the truth.
- `_events.py`: what each attempt records as WAL events (started, retrying, deleted,
  skipped, failed, cancelled, data loss), written in the background.
- `_archive.py`: what the WAL archive holds of a topic (one listing), for the data-loss
  report and replay-start (DESIGN §8).
- `_coverage.py`: before DeleteRecords, the WAL archive must hold [log start, target)
  (invariant 10): one listing per purge step; `_archive_verdicts.py` keeps the last
  blocking verdict per topic for the plan views.
- `_archive_retention.py`: the leader's loop deleting archived objects below every
  region's replay start and Kafka's log start, older than `[wal.archive] retention`.
- `_marker.py`: the topic's `pruned_entry_id`, advanced by fenced compare-and-swap.
- `_batcher.py`: Kafka offsets and DeleteRecords calls of concurrent purges, merged.
- `_ticker.py`: submits purges on a timer and when reclaimable WAL grows large.
- `_gauges.py`: the per-topic gauges, one formula for the ticker and `/metrics`.
- `_trend.py`: retained WAL per topic over time and the purges that cut it, in a
  bounded ring (the dashboard's plots); `_trend_sampler.py` fills it on the leader.
- `_services.py`: what the purge uses from the rest of metasrv, assembled once.
"""

from procedures.wal_purge._archive import (
    LISTED,
    ArchivedSpan,
    archive_covers,
    archived_ranges,
    covering_chain,
)
from procedures.wal_purge._archive_retention import ArchiveRetention, expired_objects
from procedures.wal_purge._archive_verdicts import ArchiveVerdicts
from procedures.wal_purge._batcher import Coalescer, KafkaBatcher
from procedures.wal_purge._coverage import check_archived
from procedures.wal_purge._data import FlushTarget, PurgeData
from procedures.wal_purge._gauges import export_gauges
from procedures.wal_purge._inputs import PlanInputs, flush_targets, gather_one, gather_plans
from procedures.wal_purge._marker import advance_marker, read_marker
from procedures.wal_purge._plan import (
    NO_COMMITTED_OFFSET,
    NO_STAT,
    NOT_ARCHIVED,
    RETENTION_OVERRUN,
    STALE_STAT,
    TOPIC_RESET,
    Advance,
    AfterFlushDecision,
    CatchUp,
    Cut,
    Flush,
    Lost,
    NotArchived,
    PrepareDecision,
    PurgeDecision,
    Reset,
    Skip,
    TopicStats,
    Wait,
    advanced_marker,
    decide_after_flush,
    decide_archived,
    decide_prepare,
    decide_purge,
    entries_freed,
    flush_candidates,
    flush_deadline,
    flushed_regions,
    nothing_to_cut,
    plan_topic,
    reset_marker,
)
from procedures.wal_purge._procedure import DATA_LOSS_EVENT, PurgeStep, WalPurge
from procedures.wal_purge._services import FlushMailbox, PurgeServices, StatSource, TopicMap
from procedures.wal_purge._submit import purge_manager, submit_purges
from procedures.wal_purge._ticker import PurgeTicker, TickResult
from procedures.wal_purge._trend import PurgeMark, Retained, TopicSeries, TrendRing, TrendView
from procedures.wal_purge._trend_sampler import TrendSampler, trend_capacity

__all__ = [
    "DATA_LOSS_EVENT",
    "LISTED",
    "NOT_ARCHIVED",
    "NO_COMMITTED_OFFSET",
    "NO_STAT",
    "RETENTION_OVERRUN",
    "STALE_STAT",
    "TOPIC_RESET",
    "Advance",
    "AfterFlushDecision",
    "ArchiveRetention",
    "ArchiveVerdicts",
    "ArchivedSpan",
    "CatchUp",
    "Coalescer",
    "Cut",
    "Flush",
    "FlushMailbox",
    "FlushTarget",
    "KafkaBatcher",
    "Lost",
    "NotArchived",
    "PlanInputs",
    "PrepareDecision",
    "PurgeData",
    "PurgeDecision",
    "PurgeMark",
    "PurgeServices",
    "PurgeStep",
    "PurgeTicker",
    "Reset",
    "Retained",
    "Skip",
    "StatSource",
    "TickResult",
    "TopicMap",
    "TopicSeries",
    "TopicStats",
    "TrendRing",
    "TrendSampler",
    "TrendView",
    "Wait",
    "WalPurge",
    "advance_marker",
    "advanced_marker",
    "archive_covers",
    "archived_ranges",
    "check_archived",
    "covering_chain",
    "decide_after_flush",
    "decide_archived",
    "decide_prepare",
    "decide_purge",
    "entries_freed",
    "expired_objects",
    "export_gauges",
    "flush_candidates",
    "flush_deadline",
    "flush_targets",
    "flushed_regions",
    "gather_one",
    "gather_plans",
    "nothing_to_cut",
    "plan_topic",
    "purge_manager",
    "read_marker",
    "reset_marker",
    "submit_purges",
    "trend_capacity",
]
