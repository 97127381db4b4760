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
  rules with the raw prunable id; this is the one refinement, noted in docs/deviations.md.)
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
- A **pinned consumer group** (`[wal] pin_consumer_groups`, DESIGN §8) bounds P like a
  region's need: P' = min(P, committed offset) over every pinned group (its committed
  offset is the next entry it reads, so DeleteRecords(P') never deletes at or above it).
  A pinned group with no committed offset on the topic blocks it (`no_committed_offset`,
  in `TopicPlan.blocking_groups`; the API lists it in `blocked_by` as a
  `consumer_group`). A group whose offset holds P' below the regions' need does not
  block (the purge still cuts, to P'): it is marked `holds` among the plan's
  `pinned_groups`, with every group's lag. P' may be below the marker: the marker never
  moves back, and the purge deletes only up to P' (`nothing_to_cut`, `decide_purge`).

- A **topic reset** (invariant 8) is a topic whose offsets went backwards under metasrv
  (deleted and recreated, truncated): its marker has a reset latched (`Marker.reset`), or
  its Kafka topic id is not the one the marker records (both known), or its high watermark
  is below `pruned_entry_id + 1`, or a region reported a prunable entry id above the high
  watermark - 1 (its entries are not in this topic; only stats received before Kafka was
  asked are compared: a later one may describe entries written after Kafka answered). Such
  a plan has `topic_reset` (the reason), no prune point, nothing reclaimable, and the
  regions concerned in `blocked_by` as `topic_reset`. `nothing_to_cut` never calls a reset
  topic's marker ahead of its log start work (ef11397 deleted 29 acknowledged entries so).

The purge procedure deletes below exactly this P and moves the marker to it, so a dry
run (`GET /v1/plan`) shows the P a purge started now would use.

The purge's decisions (pure: one snapshot of inputs in, one frozen decision value out;
the procedure in `_procedure.py` gathers, calls one, and does what it says; the
protocol model in the tests calls exactly these):

- `decide_prepare(plan, flush_targets, *, logical_delete) -> Reset | Lost | Skip | Flush
  | Cut`: the prepare step, from a plan made under the topic's write lock and the
  regions worth asking to flush (`FlushTarget`s).
- `decide_after_flush(plan, *, planned_topic_id, logical_delete) -> Reset | Lost | Skip
  | Cut`: the flush step once its wait is over, from a fresh plan and the Kafka topic id
  prepare planned on (`PurgeData.topic_id`).
- `decide_purge(target, plan, *, planned_topic_id, logical_delete) -> Reset | Lost | Skip
  | Wait | Advance | CatchUp`: the purge step, from the persisted `target`, the persisted
  Kafka topic id prepare planned on (`PurgeData.topic_id`) and a fresh plan made from the
  marker and Kafka's offsets as read now (`plan.pruned_entry_id` is that marker,
  `plan.log_start_offset` / `high_watermark` / `topic_id` those offsets).
  `Advance(target, lowered)`: move the marker to `target` (lowered below the persisted
  one when `lowered`: persist it first), then delete below it; `CatchUp(target)`: the
  marker is at or past the target, only Kafka's deletion is left; `Wait`: blocked, retry
  later (`Unavailable`); `Reset` / `Lost`: fail, delete nothing.
- `decide_archived(target, log_start, ranges) -> NotArchived | None`: with the WAL archive
  enabled, whether the purge step may delete below `target` (after `Advance` or `CatchUp`,
  before the marker moves or DeleteRecords): the bucket's objects (`ranges`, one listing;
  None when the store did not answer) must hold [Kafka's log start as read by the step,
  target) with no gap (`metasrv.archive.covering`), DESIGN §8 and invariant 10. The group
  pin bounds P by the archiver's committed offset already; this is the second, independent
  guard: the bucket itself, not the group's word.
- `flush_deadline(sent_at, timeout, *, wall_now, mono_now) -> float`: the monotonic
  instant the flush wait ends: the persisted wall-clock send time only shortens it (a
  resume), a clock stepped back never lengthens it past `timeout`.
- `flushed_regions(waiting, stats) -> frozenset[int]`: the flush candidates that
  reported a higher prunable id than when they were asked.
- `reset_marker(marker, reset) -> Marker | None`: the marker value that latches a
  reset, None when one is latched already.
- `advanced_marker(marker, target, topic_id) -> Marker | None`: the marker value that
  moves it to `target` (recording Kafka's topic id when known), None when it is already
  at or past it.
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

import numpy as np

from metasrv.errors import TopicReset
from metasrv.keys import Marker, ResetLatch
from metasrv.leader import StatRow
from metasrv.model import (
    BlockingRegion,
    PartitionOffsets,
    PinnedGroup,
    RegionRoute,
    TopicPlan,
    TopicStat,
)
from metasrv.wire import BlockReason
from procedures.wal_purge._data import FlushTarget

if TYPE_CHECKING:
    from metasrv.archive import ArchivedRange

NO_STAT = BlockReason.NO_STAT.value
STALE_STAT = BlockReason.STALE_STAT.value
RETENTION_OVERRUN = BlockReason.RETENTION_OVERRUN.value
TOPIC_RESET = BlockReason.TOPIC_RESET.value
NO_COMMITTED_OFFSET = BlockReason.NO_COMMITTED_OFFSET.value
NOT_ARCHIVED = BlockReason.NOT_ARCHIVED.value

# Why a topic is a reset: the first word of `TopicPlan.topic_reset` (then ": " and details).
RESET_LATCHED = "latched"
"""The marker has a reset latched; it stays until an operator resolves it."""
RESET_TOPIC_ID = "topic_id_changed"
"""Kafka's topic id is not the one the marker records, or (`decide_purge`) not the one the
purge's prepare step planned on: deleted and recreated."""
RESET_BELOW_MARKER = "high_watermark_below_marker"
"""The high watermark is below `pruned_entry_id + 1`: offsets the marker covers are gone."""
RESET_REGIONS_AHEAD = "regions_ahead_of_high_watermark"
"""Regions reported entries the topic does not have (above the high watermark - 1)."""
RESET_BELOW_TARGET = "high_watermark_below_target"
"""The high watermark fell below the purge's persisted target since it was planned."""


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


def plan_topic(
    topic: str,
    routes: Iterable[RegionRoute] | Mapping[int, RegionRoute],
    stats: TopicStats,
    *,
    now: float,
    stat_ttl: float,
    pruned_entry_id: int | None,
    offsets: PartitionOffsets | None,
    marker: Marker | None = None,
    offsets_asked_at: float | None = None,
    compare_reports: bool = True,
    pinned: Mapping[str, int | None] | None = None,
) -> TopicPlan:
    """Plan one topic from the regions mapped to it and their latest stats.

    `routes` must be every region mapped to `topic` (RegionRoutes, or a mapping region
    id -> RegionRoute as the topic-region map keeps them); `stats` are the stats that
    name `topic` (a region whose stat names another topic has none here). `now` and each
    stat's `received_at` are `time.monotonic()` values. Returns `prune_point=None` when
    the topic has no regions, is blocked or is a topic reset.

    `marker` is the stored marker whose entry id is `pruned_entry_id`: its Kafka topic id
    and reset latch are checked (None: neither known). `offsets_asked_at` is the monotonic
    instant before Kafka was asked for `offsets`: a stat received after it is not compared
    with the high watermark (None: every stat is). `compare_reports=False` skips that
    comparison (a column scan of the topic's stats): the ticker's and the API's views of
    every topic do, the purge under the topic's lock never does.

    `pinned` is each pinned consumer group's committed offset on partition 0 of the topic
    (None: the group has none), for every group `[wal] pin_consumer_groups` names; the
    caller must read them whenever groups are pinned (None or empty: no group is pinned).
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

    topic_id = offsets.topic_id if offsets is not None else None
    groups = _pinned_groups(pinned, high_watermark)
    reset = _topic_reset(
        ids,
        stats,
        marker,
        pruned_entry_id,
        high_watermark,
        topic_id,
        offsets_asked_at if compare_reports else _NOT_COMPARED,
    )
    if reset is not None:
        # Invariant 8: nothing is cut from a topic whose offsets went backwards; the
        # entries regions reported are not in it, so no loss below the log start either.
        reason, concerned = reset
        return TopicPlan(
            topic=topic,
            prune_point=None,
            pruned_entry_id=pruned_entry_id,
            log_start_offset=log_start,
            high_watermark=high_watermark,
            blocked_by=tuple(map(BlockingRegion, concerned, repeat(TOPIC_RESET))),
            reclaimable_entries=0,
            region_count=count,
            topic_reset=reason,
            topic_id=topic_id,
            pinned_groups=groups,
        )

    prune_point: int | None = None
    if count and not blocked and lowest is not None:
        # min(max(prunable_i, marker)) == max(min(prunable_i), marker).
        prune_point = lowest if pruned_entry_id is None else max(lowest, pruned_entry_id)
        if high_watermark is not None and prune_point > high_watermark - 1:
            prune_point = high_watermark - 1
        prune_point = max(prune_point, -1)
    if groups:
        prune_point, groups = _bound_by_groups(prune_point, groups)

    unverified: str | None = None
    if offsets is not None and topic_id is None and marker is not None and marker.topic_id:
        # The marker records which topic its offsets belong to and Kafka did not say which
        # topic this is: a topic recreated and written past the marker would pass every
        # other check, so no cut is named until Kafka says (invariant 8).
        unverified = "Kafka gave no topic id; the marker records one (topic reset unchecked)"
        prune_point = None

    return TopicPlan(
        topic=topic,
        prune_point=prune_point,
        pruned_entry_id=pruned_entry_id,
        log_start_offset=log_start,
        high_watermark=high_watermark,
        blocked_by=tuple(blocked),
        reclaimable_entries=(
            0 if prune_point is None else entries_freed(prune_point, log_start, pruned_entry_id)
        ),
        data_loss=tuple(lost),
        region_count=count,
        topic_id=topic_id,
        kafka_unavailable=unverified,
        pinned_groups=groups,
    )


def _pinned_groups(
    pinned: Mapping[str, int | None] | None, high_watermark: int | None
) -> tuple[PinnedGroup, ...]:
    """Each pinned group with its committed offset and lag, by name."""
    if not pinned:
        return ()
    out = []
    for group, committed in sorted(pinned.items()):
        lag = None
        if committed is not None and high_watermark is not None:
            lag = max(0, high_watermark - committed)
        out.append(PinnedGroup(group, committed, lag))
    return tuple(out)


def _bound_by_groups(
    prune_point: int | None, groups: tuple[PinnedGroup, ...]
) -> tuple[int | None, tuple[PinnedGroup, ...]]:
    """P' = min(P, every pinned group's committed offset), None when a group has none (it
    blocks); the groups, those whose offset is P' < P marked `holds`."""
    if prune_point is None:
        return None, groups
    if any(g.committed_offset is None for g in groups):
        return None, groups
    bound = min(g.committed_offset for g in groups if g.committed_offset is not None)
    if bound >= prune_point:
        return prune_point, groups
    held = tuple(
        PinnedGroup(g.group, g.committed_offset, g.lag, holds=g.committed_offset == bound)
        for g in groups
    )
    return bound, held


_NOT_COMPARED = float("-inf")
"""`offsets_asked_at` of a plan that does not compare reports with the high watermark."""


def _topic_reset(
    region_ids: list[int],
    stats: TopicStats,
    marker: Marker | None,
    pruned_entry_id: int | None,
    high_watermark: int | None,
    topic_id: str | None,
    offsets_asked_at: float | None,
) -> tuple[str, list[int]] | None:
    """(why the topic is a reset, the regions concerned), or None (module docstring)."""
    if marker is not None and marker.reset is not None:
        return f"{RESET_LATCHED}: {marker.reset.reason}", region_ids
    recorded = marker.topic_id if marker is not None else None
    if recorded is not None and topic_id is not None and recorded != topic_id:
        return (
            f"{RESET_TOPIC_ID}: Kafka's topic id {topic_id} is not the marker's {recorded}",
            region_ids,
        )
    if high_watermark is None:
        return None
    if pruned_entry_id is not None and high_watermark < pruned_entry_id + 1:
        return (
            f"{RESET_BELOW_MARKER}: high watermark {high_watermark} is below "
            f"pruned_entry_id {pruned_entry_id} + 1",
            region_ids,
        )
    if not region_ids or not len(stats) or offsets_asked_at is _NOT_COMPARED:
        return None
    found, received, prunable = stats.columns_of(region_ids)
    ahead = found & (prunable > high_watermark - 1)
    if offsets_asked_at is not None:
        # A stat received after Kafka was asked may name entries written since.
        ahead &= received <= offsets_asked_at
    if not ahead.any():
        return None
    at = np.flatnonzero(ahead).tolist()
    regions = list(map(region_ids.__getitem__, at))
    highest = int(prunable[ahead].max())
    shown = ", ".join(map(str, regions[:10])) + (" and more" if len(regions) > 10 else "")
    return (
        f"{RESET_REGIONS_AHEAD}: regions {shown} reported entries up to {highest}, "
        f"above the high watermark {high_watermark} - 1",
        regions,
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


def entries_freed(
    prune_point: int, log_start: int | None, pruned: int | None, *, logical_delete: bool = False
) -> int:
    """Entries a purge to `prune_point` frees: those from what is gone already up to it; 0
    when it is at or below that. Gone already: what is below Kafka's log start and, with
    logical deletion (nothing leaves Kafka) or without Kafka's offsets, what is below the
    stored marker `pruned` (no region replays it). The plan's `reclaimable_entries` and a
    finished purge's `entries_deleted`."""
    base = log_start if log_start is not None else 0
    if logical_delete or log_start is None:
        base = max(base, pruned if pruned is not None else 0)
    return max(0, prune_point - base)


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
    rows = stats.rows_of([route.region_id for route in routes])
    out = []
    for route, row in zip(routes, rows, strict=True):
        if row is None:
            continue
        replay = int(topic_stat.bytes_of(max(0, latest - row.prunable_entry_id)))
        if replay > trigger_bytes:
            out.append((route, row, replay))
    return out


def describe_blocked(plan: TopicPlan) -> str:
    """Why a plan has no prune point, in one line (the first ten blocking regions)."""
    if plan.region_count == 0:
        return "no regions mapped to the topic"
    groups = [f"consumer group {g} ({NO_COMMITTED_OFFSET})" for g in plan.blocking_groups]
    if plan.kafka_unavailable is not None and not plan.blocked_by and not groups:
        return f"Kafka: {plan.kafka_unavailable}"
    named = [f"{b.region_id} ({b.reason})" for b in plan.blocked_by[:10]]
    shown = ", ".join([*groups, *named])
    more = len(plan.blocked_by) - 10
    return f"blocked by {shown}" + (f" and {more} more" if more > 0 else "")


def held_by(plan: TopicPlan) -> str:
    """The words naming the pinned groups that hold the plan's P below the regions' need
    (" (held by consumer group G)"), else "" (the reason a purge skipped names them)."""
    holding = [g.group for g in plan.pinned_groups if g.holds]
    return f" (held by consumer group {', '.join(holding)})" if holding else ""


def nothing_to_cut(plan: TopicPlan, *, logical_delete: bool = False) -> str | None:
    """Why an unblocked plan's P would not move the marker nor Kafka's log start, or None
    when a purge has something to do.

    With physical deletion, a marker ahead of Kafka's log start (a deletion that failed
    after the marker moved, or a log start that moved back with partition leadership)
    is work: the purge deletes up to the marker.
    """
    if plan.topic_reset is not None:
        # A reset topic's log start is not the marker's: never "work" (ef11397 deleted 29
        # acknowledged entries of a recreated topic so).
        return f"topic reset: {plan.topic_reset}"
    p = plan.prune_point
    if p is None:
        return None
    if p < 0:
        return "nothing to purge: a region has no entry flushed yet"
    if plan.pruned_entry_id is not None and p <= plan.pruned_entry_id:
        log_start = plan.log_start_offset
        if not logical_delete and log_start is not None and log_start < p:
            return None
        return (
            f"up to date: prune point {p} <= pruned_entry_id {plan.pruned_entry_id}{held_by(plan)}"
        )
    return None


# --- the purge's decisions ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Skip:
    """End the purge as `skipped`: nothing to cut, or blocked."""

    reason: str


@dataclass(frozen=True, slots=True)
class Lost:
    """WAL data loss (invariant 7): Kafka's log start is above entries these regions need.
    Report it, fail the purge, move nothing."""

    regions: tuple[int, ...]
    log_start_offset: int | None


@dataclass(frozen=True, slots=True)
class Reset:
    """A topic reset (invariant 8): latch it in the marker, report it, fail the purge,
    delete nothing."""

    reason: str
    regions: tuple[int, ...]
    """The regions concerned (every mapped region, or the ones whose reports are ahead)."""
    topic_id: str | None
    """Kafka's topic id as read now."""
    high_watermark: int | None
    """Kafka's high watermark as read now."""


@dataclass(frozen=True, slots=True)
class Flush:
    """Ask these regions to flush, then plan again (the flush step)."""

    prune_point: int
    targets: tuple[FlushTarget, ...]


@dataclass(frozen=True, slots=True)
class Cut:
    """Go on to the purge step with this prune point."""

    prune_point: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing may move now (a region has not reported, Kafka gave no offsets): retry the
    step later (`Unavailable`)."""

    reason: str
    regions: tuple[int, ...] = ()
    groups: tuple[str, ...] = ()
    """Pinned consumer groups with no committed offset on the topic."""


@dataclass(frozen=True, slots=True)
class Advance:
    """Move the marker to `target` by fenced CAS, then delete below it (unless logical
    deletion). `lowered`: the fresh P is below the persisted target; persist the new
    target before the marker moves."""

    target: int
    lowered: bool = False


@dataclass(frozen=True, slots=True)
class CatchUp:
    """The marker is at or past `target` already: only Kafka's deletion below it (and the
    history) is left; nobody replays below the marker, so no stats are needed."""

    target: int


@dataclass(frozen=True, slots=True)
class NotArchived:
    """The WAL archive does not hold what a purge would delete, [log_start, target): delete
    nothing, move nothing; the purge ends `skipped` with `reason` (DESIGN §8)."""

    log_start: int
    target: int
    gap: tuple[int, int] | None
    """The first entries no object holds, [first, end); None when the store did not answer."""
    error: str | None = None
    """What the store said instead of a listing."""

    @property
    def reason(self) -> str:
        if self.gap is None:
            why = f"its store did not answer ({self.error})"
        else:
            why = f"the bucket lacks entries [{self.gap[0]}, {self.gap[1]})"
        return (
            f"blocked by the WAL archive ({NOT_ARCHIVED}): {why} of [{self.log_start}, "
            f"{self.target}); nothing deleted"
        )


PrepareDecision = Reset | Lost | Skip | Flush | Cut
AfterFlushDecision = Reset | Lost | Skip | Cut
PurgeDecision = Reset | Lost | Skip | Wait | Advance | CatchUp


def _reset(plan: TopicPlan) -> Reset:
    assert plan.topic_reset is not None
    return Reset(
        reason=plan.topic_reset,
        regions=tuple(b.region_id for b in plan.blocked_by if b.reason == TOPIC_RESET),
        topic_id=plan.topic_id,
        high_watermark=plan.high_watermark,
    )


def decide_prepare(
    plan: TopicPlan, flush_targets: Sequence[FlushTarget], *, logical_delete: bool
) -> PrepareDecision:
    """The prepare step's decision, from a plan made under the topic's write lock and the
    regions worth asking to flush.

    An up-to-date topic may still have regions far behind that flush only when asked;
    skipping before asking them would pin the prune point forever, so candidates win
    over "nothing to cut" (not over a blocked plan: a flush cannot unblock it).
    """
    if plan.topic_reset is not None:
        return _reset(plan)
    if plan.data_loss:
        return Lost(plan.data_loss, plan.log_start_offset)
    p = plan.prune_point
    if p is None:
        return Skip(describe_blocked(plan))
    if flush_targets:
        return Flush(p, tuple(flush_targets))
    idle = nothing_to_cut(plan, logical_delete=logical_delete)
    if idle is not None:
        return Skip(idle)
    return Cut(p)


def _recreated(plan: TopicPlan, planned_topic_id: str | None) -> Reset | None:
    """A `Reset` when Kafka's topic id in `plan` is not `planned_topic_id`, the one the
    purge's prepare step planned on (both known): the topic was deleted and recreated
    during the purge, and the P it planned came from reports of the old topic."""
    now_id = plan.topic_id
    if planned_topic_id is None or now_id is None or now_id == planned_topic_id:
        return None
    return Reset(
        reason=f"{RESET_TOPIC_ID}: Kafka's topic id {now_id} is not the "
        f"{planned_topic_id} the purge planned on",
        regions=(),
        topic_id=now_id,
        high_watermark=plan.high_watermark,
    )


def decide_after_flush(
    plan: TopicPlan, *, planned_topic_id: str | None, logical_delete: bool
) -> AfterFlushDecision:
    """The flush step's decision once its wait is over, from a fresh plan and the Kafka
    topic id prepare planned on (`planned_topic_id`): the new P must pass every check
    again, and a topic recreated since prepare is a `Reset` (as in `decide_purge`)."""
    if plan.topic_reset is not None:
        return _reset(plan)
    recreated = _recreated(plan, planned_topic_id)
    if recreated is not None:
        return recreated
    if plan.data_loss:
        return Lost(plan.data_loss, plan.log_start_offset)
    p = plan.prune_point
    if p is None:
        return Skip(describe_blocked(plan))
    idle = nothing_to_cut(plan, logical_delete=logical_delete)
    if idle is not None:
        return Skip(idle)
    return Cut(p)


NOTHING_LEFT = "prune point fell to the marker after regions changed; nothing to purge"


def decide_purge(
    target: int, plan: TopicPlan, *, planned_topic_id: str | None, logical_delete: bool
) -> PurgeDecision:
    """The purge step's decision (the only step that destroys data), from the persisted
    `target`, the persisted Kafka topic id the prepare step planned on
    (`planned_topic_id`, None when Kafka did not say) and a plan made now from the marker
    and Kafka's offsets as read now.

    - A reset topic (the plan's; Kafka's topic id now not the one prepare planned on, both
      known; or a high watermark now below the target, which was at most the high
      watermark - 1 when planned) is `Reset`: nothing is deleted. The topic id check
      covers a topic recreated during the purge before any marker recorded its id (a
      first purge): the target was planned from reports of the old topic, and the new
      one's entries at those offsets are not flushed. While Kafka gives no topic id and
      prepare had one, the step waits (`Wait`): that check cannot be made.
    - A marker at or past the target: `CatchUp`, delete below the target only; nobody
      replays below the marker, so this needs no stats (a new leader finishes it). The
      pinned consumer groups still bound it: their committed offsets as read now lower
      the deletion (a target persisted before a group was pinned, or before its offset
      was read, never deletes past it), and a pinned group with no committed offset
      makes it `Wait`.
    - Otherwise the target is re-validated against the fresh plan (resume rule, module
      docstring of `_procedure.py`): data loss is `Lost`; a blocked plan (after a leader
      change every region must report again) is `Wait`; a P at or above the target keeps
      it; a lower P lowers it (`Advance(lowered=True)`), or ends the purge (`Skip`) when
      it is at or below the marker. The fresh P is bounded by the pinned groups' committed
      offsets as read now (`plan_topic`), so a lowered target never passes one.
    """
    if plan.topic_reset is not None:
        return _reset(plan)
    recreated = _recreated(plan, planned_topic_id)
    if recreated is not None:
        return recreated
    if planned_topic_id is not None and plan.topic_id is None:
        # Kafka did not say which topic this is now (DescribeTopics slow): a topic
        # recreated since prepare and written past the target passes every other check,
        # the marker's too (a catch-up included).
        return Wait(
            f"topic {plan.topic}: Kafka gave no topic id; the purge planned on "
            f"{planned_topic_id} (topic reset unchecked)"
        )
    high_watermark = plan.high_watermark
    if high_watermark is None or plan.log_start_offset is None:
        return Wait(f"topic {plan.topic}: Kafka's offsets unknown")
    if target > high_watermark:
        return Reset(
            reason=f"{RESET_BELOW_TARGET}: high watermark {high_watermark} is below the "
            f"purge's target {target}",
            regions=(),
            topic_id=plan.topic_id,
            high_watermark=high_watermark,
        )
    marker = plan.pruned_entry_id
    if marker is not None and marker >= target:
        if plan.blocking_groups:
            return Wait(
                f"cannot catch up to {target}: {describe_blocked(plan)}",
                groups=plan.blocking_groups,
            )
        bound = plan.pinned_bound
        return CatchUp(target if bound is None else min(target, bound))
    if plan.data_loss:
        return Lost(plan.data_loss, plan.log_start_offset)
    fresh = plan.prune_point
    if fresh is None:
        return Wait(
            f"cannot re-validate target {target}: {describe_blocked(plan)}; "
            "waiting for regions to report",
            tuple(b.region_id for b in plan.blocked_by),
            plan.blocking_groups,
        )
    if fresh >= target:
        return Advance(target)
    if fresh < 0 or (marker is not None and fresh <= marker):
        return Skip(NOTHING_LEFT)
    return Advance(fresh, lowered=True)


def decide_archived(
    target: int, log_start: int, ranges: Sequence[ArchivedRange] | None, *, error: str = ""
) -> NotArchived | None:
    """None when the purge step may delete below `target`: nothing is left below it
    (`log_start` >= `target`) or the archived `ranges` (one listing of the topic's objects)
    hold every entry of [log_start, target). Otherwise `NotArchived` with the first gap, or,
    when `ranges` is None (the store did not answer: `error`), with none."""
    if log_start >= target:
        return None
    if ranges is None:
        return NotArchived(log_start, target, None, error or "no listing")
    from metasrv.archive import covering  # pyarrow and boto3: only where the archive is on

    coverage = covering(ranges, log_start, target)
    return None if coverage.gap is None else NotArchived(log_start, target, coverage.gap)


def flush_deadline(sent_at: float, timeout: float, *, wall_now: float, mono_now: float) -> float:
    """The monotonic instant the flush wait of instructions sent at wall-clock `sent_at`
    ends. The wall clock only shortens the wait (a resume after the persisted send); a
    clock stepped back never holds the topic's lock past `timeout` from now."""
    remaining = min(timeout, max(0.0, sent_at + timeout - wall_now))
    return mono_now + remaining


def flushed_regions(waiting: Mapping[int, int], stats: TopicStats) -> frozenset[int]:
    """The regions of `waiting` (region id -> prunable id when asked to flush) whose stat
    in `stats` now has a higher prunable id."""
    ids = list(waiting)
    rows = stats.rows_of(ids)
    return frozenset(
        region_id
        for region_id, row in zip(ids, rows, strict=True)
        if row is not None and row.prunable_entry_id > waiting[region_id]
    )


def reset_marker(marker: Marker | None, reset: Reset) -> Marker | None:
    """The marker value that latches `reset` (keeping the entry id and topic id), or None
    when a reset is latched already (the first one found stays)."""
    if marker is not None and marker.reset is not None:
        return None
    latch = ResetLatch(reset.reason, reset.topic_id, reset.high_watermark)
    if marker is None:
        return Marker(reset=latch)
    return Marker(marker.pruned_entry_id, marker.topic_id, latch)


def advanced_marker(marker: Marker | None, target: int, topic_id: str | None) -> Marker | None:
    """The marker value moved to `target`, recording Kafka's `topic_id` when known; None
    when the marker is at or past `target` already (monotonic, invariant 5).

    Raises `TopicReset` when the marker has a reset latched or records another topic id:
    a marker never moves on a reset topic, even one latched since the step planned.
    """
    if marker is not None:
        if marker.reset is not None:
            raise TopicReset(f"topic reset latched: {marker.reset.reason}; marker not moved")
        if marker.topic_id is not None and topic_id is not None and marker.topic_id != topic_id:
            raise TopicReset(
                f"Kafka's topic id {topic_id} is not the marker's {marker.topic_id}; "
                "marker not moved"
            )
        if marker.pruned_entry_id is not None and marker.pruned_entry_id >= target:
            return None
    recorded = topic_id if topic_id is not None else (marker.topic_id if marker else None)
    return Marker(target, recorded, None)
