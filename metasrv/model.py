"""Domain types shared by the metadata plane, the procedures and the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec
import numpy as np

ID_MAX = 2**63 - 1
"""The highest id or counter any entry point accepts (region and node ids, entry ids,
sizes): int64, as the kv values, the stat history and Kafka offsets hold them."""

NULL: Final = -(2**63)
"""A null in an int64 column (`topic_latest_entry_id`, `manifest_version`): below every
id's range. The heartbeat's columns encoding and the leader's stat table both use it."""


# --- a region's prunable entry id: one rule, for one region and a column at a time ------


def prunable_entry_id(
    flushed_entry_id: int, topic_latest_entry_id: int | None, memtable_bytes: int
) -> int:
    """`max(flushed_entry_id, topic_latest_entry_id or -1)` (DESIGN §1), where an idle claim
    (`topic_latest_entry_id`) counts only with an empty memtable: DESIGN §1 has datanodes
    report it only then, and a claim next to unflushed data is the race in which a region
    lost its memtable's entries to a purge (it is ignored and counted instead)."""
    if topic_latest_entry_id is None or memtable_bytes > 0:
        return flushed_entry_id
    return topic_latest_entry_id if topic_latest_entry_id > flushed_entry_id else flushed_entry_id


def idle_claim_ignored(topic_latest_entry_id: int | None, memtable_bytes: int) -> bool:
    """An idle claim sent with a non-empty memtable: stored, not trusted
    (`prunable_entry_id`)."""
    return topic_latest_entry_id is not None and memtable_bytes > 0


def prunable_entry_ids(
    flushed_entry_id: np.ndarray, topic_latest_entry_id: np.ndarray, memtable_bytes: np.ndarray
) -> np.ndarray:
    """`prunable_entry_id` of many regions, a column each (`NULL`: no idle claim)."""
    trusted = (topic_latest_entry_id != NULL) & (memtable_bytes <= 0)
    higher = trusted & (topic_latest_entry_id > flushed_entry_id)
    prunable: np.ndarray = np.where(higher, topic_latest_entry_id, flushed_entry_id)
    return prunable


def idle_claims_ignored(
    topic_latest_entry_id: np.ndarray, memtable_bytes: np.ndarray
) -> np.ndarray:
    """`idle_claim_ignored` of many regions, a column each (`NULL`: no idle claim)."""
    ignored: np.ndarray = (topic_latest_entry_id != NULL) & (memtable_bytes > 0)
    return ignored


def replay_start_entry_id(
    stat: RegionStat | None,
    checkpoint_entry_id: int | None,
    pruned_entry_id: int | None,
    in_flight_target: int | None = None,
) -> int:
    """Where a restarting region replays its WAL from (DESIGN §1):
    `max(prunable_entry_id, pruned_entry_id, in_flight_target) + 1`.

    The region needs nothing at or below its prunable id (its flushed id, or the topic's
    latest id when it reported an empty memtable: every entry it writes afterwards is
    above that), and nothing at or below the marker. The prunable id is the live `stat`'s,
    else the persisted checkpoint (a checkpoint is a prunable id), else -1. A purge never
    deletes past the prunable id of any mapped region, so this start stays readable after
    it is answered, through every later purge.

    `in_flight_target` is the persisted intent (`PurgeData.target`) of a purge of the
    region's topic that has not finished: its marker write and DeleteRecords may land
    after this answer, so no answer is below it. A region's prunable id may drop below it
    after the purge step re-validated (the region wrote again, ending an idle claim), but
    the region needs nothing at or below it: the target was at most every mapped
    region's prunable id when it was validated, and every entry written since lies above
    Kafka's high watermark of then, so above the target.
    """
    if stat is not None:
        needs_after = stat.prunable_entry_id
    elif checkpoint_entry_id is not None:
        needs_after = checkpoint_entry_id
    else:
        needs_after = -1
    below = (needs_after, pruned_entry_id, in_flight_target)
    return max(b for b in below if b is not None) + 1


def region_id_of(table_id: int, region_number: int) -> int:
    """`region_id = table_id << 32 | region_number` (DESIGN §1)."""
    return (table_id << 32) | region_number


@dataclass(frozen=True, slots=True)
class RegionStat:
    """What one heartbeat said about one region."""

    region_id: int
    """64-bit region id."""
    node_id: int
    """Datanode hosting the region."""
    topic: str
    """Topic the region writes its WAL to."""
    flushed_entry_id: int
    """Every entry <= this is durable in the region's own storage (>= -1)."""
    topic_latest_entry_id: int | None
    """Topic's latest entry id when the memtable was seen empty; None otherwise."""
    memtable_bytes: int
    """Bytes held in the memtable."""
    manifest_version: int | None
    """Region manifest version; orders stats across region restarts."""
    received_at: float
    """Monotonic-clock time (time.monotonic()) the leader received it."""

    @property
    def prunable_entry_id(self) -> int:
        """The entry id below which this region needs nothing (`prunable_entry_id()`)."""
        return prunable_entry_id(
            self.flushed_entry_id, self.topic_latest_entry_id, self.memtable_bytes
        )

    @property
    def idle_claim_ignored(self) -> bool:
        """It reported `topic_latest_entry_id` with a non-empty memtable (not trusted)."""
        return idle_claim_ignored(self.topic_latest_entry_id, self.memtable_bytes)


@dataclass(frozen=True, slots=True)
class TopicStat:
    """What datanodes said about one topic."""

    topic: str
    latest_entry_id: int
    """Highest entry id a datanode has seen written."""
    avg_record_size: float
    """Average record size over the recent window, from the cumulative counters."""
    received_at: float
    """Monotonic-clock time of the last report."""

    def bytes_of(self, entries: int) -> float:
        """The estimated size of `entries` WAL entries of this topic: entries x the average
        record size (the retained-bytes gauges, the size trigger, a purge's freed bytes)."""
        return entries * self.avg_record_size


@dataclass(frozen=True, slots=True)
class RegionRoute:
    """A region's place in the topic-region map (kv `__topic_region/...`)."""

    region_id: int
    """64-bit region id."""
    topic: str
    """Mapped topic."""
    node_id: int
    """Datanode the region was registered on."""
    checkpoint_entry_id: int | None
    """Last persisted prunable entry id, or None before the first checkpoint."""


class BlockingRegion(msgspec.Struct, frozen=True, gc=False):
    """A region that keeps its topic from being purged, and why. A struct, built in C: a
    new leader's plans name every region of a million that has not reported yet."""

    region_id: int
    reason: str
    """`no_stat`, `stale_stat` or `retention_overrun`."""


@dataclass(frozen=True, slots=True)
class PinnedGroup:
    """A pinned consumer group (`[wal] pin_consumer_groups`, DESIGN §8) as one topic's plan
    saw it: its committed offset on partition 0 bounds every purge of the topic."""

    group: str
    committed_offset: int | None
    """The group's committed offset (the next entry it reads); None: it has none on the
    topic, which blocks the topic's purge (`no_committed_offset`)."""
    lag: int | None = None
    """High watermark - committed offset (entries the group has still to read), at least 0;
    None when either is unknown."""
    holds: bool = False
    """Its committed offset is what holds the prune point below the regions' need."""


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Kafka offsets of a topic's partition 0."""

    log_start_offset: int
    """Earliest readable offset (low watermark)."""
    high_watermark: int
    """Offset the next record will get."""
    topic_id: str | None = None
    """Kafka's id of the topic (a UUID as Kafka prints it); a topic deleted and recreated
    under the same name gets a new one. None when the adapter did not learn it."""


def retained_entries(log_start_offset: int, high_watermark: int) -> int:
    """Entries Kafka holds of a partition: high watermark - log start (the retained
    gauges, the WAL trend)."""
    return max(0, high_watermark - log_start_offset)


@dataclass(frozen=True, slots=True)
class TopicDurability:
    """How durably Kafka keeps a topic's writes, as Kafka reports it."""

    replication_factor: int
    """Replicas of partition 0 in Kafka's metadata."""
    min_insync_replicas: int | None
    """Effective `min.insync.replicas` (DescribeConfigs: the topic's own value or the
    brokers' default); None when Kafka did not say."""


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """The prune plan of one topic at one instant (the pure function's result)."""

    topic: str
    prune_point: int | None
    """P: offsets < P may be deleted; None when blocked or the topic has no regions."""
    pruned_entry_id: int | None
    """P of the last completed purge."""
    log_start_offset: int | None
    """Kafka's earliest offset (None when Kafka was not asked)."""
    high_watermark: int | None
    """Kafka's high watermark (None when Kafka was not asked)."""
    blocked_by: tuple[BlockingRegion, ...]
    """Regions that stop the purge."""
    reclaimable_entries: int
    """Entries a purge to P would delete now (`procedures.wal_purge.entries_freed`)."""
    data_loss: tuple[int, ...] = ()
    """Regions whose needed entries Kafka no longer holds (invariant 7)."""
    region_count: int = 0
    """Regions mapped to the topic."""
    kafka_unavailable: str | None = None
    """Why Kafka's offsets of the topic could not be read when they were asked; the plan
    then has no prune point (a purge started now would wait for Kafka)."""
    topic_reset: str | None = None
    """Why the topic is a topic reset (DESIGN §2 invariant 8: its offsets went backwards
    under metasrv, or its Kafka topic id is not the marker's), or None. A reset topic has
    no prune point until an operator resolves it."""
    topic_id: str | None = None
    """Kafka's topic id when the plan read the offsets (None when unknown)."""
    pinned_groups: tuple[PinnedGroup, ...] = ()
    """Every pinned consumer group with its committed offset on the topic, by name."""
    not_archived: str | None = None
    """Why the last purge of the topic this process ran deleted nothing because the WAL
    archive did not hold [log start, target) (`procedures.wal_purge.ArchiveVerdicts`), or
    None. Not a cause of `prune_point` None: the next purge checks the bucket again."""

    @property
    def blocking_groups(self) -> tuple[str, ...]:
        """Pinned groups with no committed offset on the topic: each blocks its purge."""
        return tuple(g.group for g in self.pinned_groups if g.committed_offset is None)

    @property
    def pinned_bound(self) -> int | None:
        """The lowest committed offset of the pinned groups: nothing at or above it is ever
        deleted (DESIGN §8); None when no group is pinned or one has no offset (blocked)."""
        offsets = [g.committed_offset for g in self.pinned_groups]
        if not offsets or None in offsets:
            return None
        return min(o for o in offsets if o is not None)
