"""The prune plan: where each topic may be cut, and what stops it (DESIGN §1-2).

Pure functions, no I/O and no clock: callers pass the topic-region map, the leader's
in-memory stats, `now` (monotonic), the stored `pruned_entry_id` and, when they asked
Kafka, the partition offsets. This is the safety core of the product; every rule below
is one of DESIGN §2's invariants:

- P(topic) = min(prunable_entry_id) over EVERY region mapped to the topic (invariant 1).
- A mapped region with no stat, or a stat older than `stat_ttl`, blocks the topic
  (invariants 2 and 3: after a leader change the stats are empty, so every topic is
  blocked until each of its regions has reported to the new leader).
- A region's need is measured from `max(prunable_entry_id, pruned_entry_id)`: a region
  replays from `max(flushed_entry_id, pruned_entry_id) + 1`, so nothing at or below our
  own marker is ever read again. Without this, a region that was idle while the marker
  moved (it reported the topic's latest id) and then wrote again, or one registered after
  a purge, would fall below the marker and read as WAL data loss. (DESIGN §1-2 state the
  rules with the raw prunable id; this is the one refinement, noted in the README.)
- If Kafka's log start offset is above that need + 1, entries the region still needs are
  gone: the region is listed in `data_loss` AND blocks the topic (`retention_overrun`), so
  the marker never silently moves past the gap (invariant 7). It clears by itself once
  the region flushes past the gap.
- P is at most the latest written entry, high watermark - 1 (invariant 6 asks for at most
  the high watermark): P is also the new marker, which says "no region needs an entry
  <= P", and an entry not written yet will be needed by its writer. P is never raised
  and never below -1: a region that has flushed nothing gives P = -1, "nothing to
  delete". (Kafka reads a DeleteRecords offset of -1 as "everything"; the Kafka adapter
  refuses negative offsets outright.)

The purge procedure deletes below exactly this P and moves the marker to it, so a dry
run (`GET /v1/plan`) shows the P a purge started now would use.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, KeysView, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Protocol

import numpy as np

from metasrv.leader import StatRow
from metasrv.model import (
    BlockingRegion,
    PartitionOffsets,
    RegionRoute,
    TopicPlan,
    TopicStat,
)
from metasrv.wire import BlockReason

NO_STAT = BlockReason.NO_STAT.value
STALE_STAT = BlockReason.STALE_STAT.value
RETENTION_OVERRUN = BlockReason.RETENTION_OVERRUN.value


class TopicStats(Protocol):
    """The stored stats of the regions that reported on one topic, as the planner reads
    them (`metasrv.leader.TopicRows`: one topic's rows of the leader's stat table). A
    region whose stat names another topic is not among them."""

    def __len__(self) -> int: ...

    def keys(self) -> KeysView[int]:
        """The regions with a stat."""
        ...

    def get(self, region_id: int, /) -> StatRow | None:
        """The region's stat, None when it has none."""
        ...

    def rows_of(self, region_ids: list[int]) -> list[StatRow | None]:
        """Each region's stat, None where it has none."""
        ...

    def columns_of(self, region_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per region: whether it has a stat, and the stat's `received_at` and
        `prunable_entry_id` (meaningless where it has none), a column each."""
        ...

    def lowest_prunable(self, fresh_after: float) -> int | None:
        """The lowest `prunable_entry_id` over every stat, or None when there is none or
        one was received before `fresh_after`."""
        ...


class StatsByTopic(Protocol):
    """Every topic's `TopicStats` (`metasrv.leader.StatTable`, a copy of the leader's)."""

    def topic_rows(self, topic: str) -> TopicStats: ...


def plan_topic(
    topic: str,
    routes: Iterable[RegionRoute] | Mapping[int, RegionRoute],
    stats: TopicStats,
    *,
    now: float,
    stat_ttl: float,
    pruned_entry_id: int | None,
    offsets: PartitionOffsets | None,
) -> TopicPlan:
    """Plan one topic from the regions mapped to it and their latest stats.

    `routes` must be every region mapped to `topic` (RegionRoutes, or a mapping region
    id -> RegionRoute as the topic-region map keeps them); `stats` are the stats that
    name `topic` (a region whose stat names another topic has none here). `now` and each
    stat's `received_at` are `time.monotonic()` values. Returns `prune_point=None` when
    the topic has no regions or is blocked.
    """
    log_start = offsets.log_start_offset if offsets is not None else None
    high_watermark = offsets.high_watermark if offsets is not None else None
    # Ages above this are stale; comparing received_at to one threshold avoids a
    # subtraction per region.
    fresh_after = now - stat_ttl
    # A needed entry is lost when log_start > max(prunable, marker) + 1, i.e. when
    # prunable < log_start - 1 and the marker is too; a marker at or above that bound
    # means our own purge made the gap, and no region replays below the marker.
    loss_below = log_start - 1 if log_start is not None else None
    if loss_below is not None and pruned_entry_id is not None and pruned_entry_id >= loss_below:
        loss_below = None

    # Region ids: a Mapping's keys are read without touching a RegionRoute object.
    ids: list[int] = list(routes) if isinstance(routes, Mapping) else list(map(_region_id, routes))
    count = len(ids)
    lowest: int | None = None
    blocked: list[BlockingRegion] = []
    lost: list[int] = []
    if count:
        mapped = routes.keys() if isinstance(routes, Mapping) else set(ids)
        if len(stats) == count and stats.keys() == mapped:
            # Fast path: the stats naming this topic are exactly the mapped regions'.
            lowest = stats.lowest_prunable(fresh_after)  # a column at a time
            if lowest is not None and loss_below is not None and lowest < loss_below:
                lowest = None
        if lowest is None:
            if not len(stats):  # no stat names the topic (a new leader)
                blocked = list(map(BlockingRegion, ids, repeat(NO_STAT)))
            else:
                lowest, blocked, lost = _scan(ids, stats, fresh_after, loss_below)

    prune_point: int | None = None
    if count and not blocked and lowest is not None:
        # min(max(prunable_i, marker)) == max(min(prunable_i), marker).
        prune_point = lowest if pruned_entry_id is None else max(lowest, pruned_entry_id)
        if high_watermark is not None and prune_point > high_watermark - 1:
            prune_point = high_watermark - 1
        prune_point = max(prune_point, -1)

    return TopicPlan(
        topic=topic,
        prune_point=prune_point,
        pruned_entry_id=pruned_entry_id,
        log_start_offset=log_start,
        high_watermark=high_watermark,
        blocked_by=tuple(blocked),
        reclaimable_entries=_reclaimable(prune_point, log_start, pruned_entry_id),
        data_loss=tuple(lost),
        region_count=count,
    )


_REASONS: tuple[str, ...] = ("", NO_STAT, STALE_STAT, RETENTION_OVERRUN)
"""Blocking reasons by the codes `_scan` gives them (0: not blocked)."""


def _scan(
    region_ids: list[int], stats: TopicStats, fresh_after: float, loss_below: int | None
) -> tuple[int | None, list[BlockingRegion], list[int]]:
    """Region by region, a column at a time (what a new leader plans while a million
    regions have not all reported): (the lowest prunable id of the fresh stats, the
    blocking regions in `region_ids` order, the regions with data loss).

    A region without a stat is `no_stat`; one received before `fresh_after` is
    `stale_stat`; a fresh one whose prunable id is below `loss_below` lost entries it
    needs (`retention_overrun`)."""
    found, received, prunable = stats.columns_of(region_ids)
    stale = found & (received < fresh_after)
    counted = found & ~stale
    lowest = int(prunable[counted].min()) if counted.any() else None
    reason = np.where(found, np.where(stale, 2, 0), 1).astype(np.int8)
    lost: list[int] = []
    if loss_below is not None:
        overrun = counted & (prunable < loss_below)
        reason[overrun] = 3
        lost = list(map(region_ids.__getitem__, np.flatnonzero(overrun).tolist()))
    at = np.flatnonzero(reason).tolist()
    blocked = list(
        map(
            BlockingRegion,
            map(region_ids.__getitem__, at),
            map(_REASONS.__getitem__, reason[at].tolist()),
        )
    )
    return lowest, blocked, lost


_region_id = attrgetter("region_id")


def _reclaimable(prune_point: int | None, log_start: int | None, pruned: int | None) -> int:
    """Entries a purge to P would delete now; 0 when P is at or below what is gone already.

    Without Kafka offsets the stored marker stands in for the log start: everything
    below it was deleted by an earlier purge.
    """
    if prune_point is None:
        return 0
    base = log_start if log_start is not None else (pruned if pruned is not None else 0)
    return max(0, prune_point - base)


def plan_topics(
    routes_by_topic: Mapping[str, Collection[RegionRoute] | Mapping[int, RegionRoute]],
    stats: StatsByTopic,
    *,
    now: float,
    stat_ttl: float,
    pruned_entry_ids: Mapping[str, int | None],
    offsets: Mapping[str, PartitionOffsets] | None = None,
    topics: Iterable[str] | None = None,
) -> dict[str, TopicPlan]:
    """Plan many topics at once: `topics` (default: every key of `routes_by_topic`).

    A topic absent from `routes_by_topic` has no regions; one absent from `offsets`
    is planned without Kafka's offsets.
    """
    names = list(routes_by_topic) if topics is None else list(topics)
    known = offsets or {}
    return {
        topic: plan_topic(
            topic,
            routes_by_topic.get(topic, ()),
            stats.topic_rows(topic),
            now=now,
            stat_ttl=stat_ttl,
            pruned_entry_id=pruned_entry_ids.get(topic),
            offsets=known.get(topic),
        )
        for topic in names
    }


def flush_candidates(
    routes: Sequence[RegionRoute],
    stats: TopicStats,
    *,
    topic_stat: TopicStat | None,
    high_watermark: int | None,
    trigger_bytes: int,
) -> list[tuple[RegionRoute, StatRow, int]]:
    """Regions whose estimated replay bytes, (topic latest - prunable) x average record
    size, exceed `trigger_bytes`: (route, stored row, replay bytes) each."""
    if topic_stat is None or topic_stat.avg_record_size <= 0:
        return []
    latest = topic_stat.latest_entry_id
    if high_watermark is not None:
        latest = max(latest, high_watermark - 1)
    avg = topic_stat.avg_record_size
    rows = stats.rows_of([route.region_id for route in routes])
    out = []
    for route, row in zip(routes, rows, strict=True):
        if row is None:
            continue
        replay = int(max(0, latest - row.prunable_entry_id) * avg)
        if replay > trigger_bytes:
            out.append((route, row, replay))
    return out


def describe_blocked(plan: TopicPlan) -> str:
    """Why a plan has no prune point, in one line (the first ten blocking regions)."""
    if plan.region_count == 0:
        return "no regions mapped to the topic"
    shown = ", ".join(f"{b.region_id} ({b.reason})" for b in plan.blocked_by[:10])
    more = len(plan.blocked_by) - 10
    return f"blocked by {shown}" + (f" and {more} more" if more > 0 else "")


def nothing_to_cut(plan: TopicPlan, *, logical_delete: bool = False) -> str | None:
    """Why an unblocked plan's P would not move the marker nor Kafka's log start, or None
    when a purge has something to do.

    With physical deletion, a marker ahead of Kafka's log start (a deletion that failed
    after the marker moved, or a log start that moved back with partition leadership)
    is work: the purge deletes up to the marker.
    """
    p = plan.prune_point
    if p is None:
        return None
    if p < 0:
        return "nothing to purge: a region has no entry flushed yet"
    if plan.pruned_entry_id is not None and p <= plan.pruned_entry_id:
        log_start = plan.log_start_offset
        if not logical_delete and log_start is not None and log_start < p:
            return None
        return f"up to date: prune point {p} <= pruned_entry_id {plan.pruned_entry_id}"
    return None
