"""A topic's plan inputs (routes, stats, marker, Kafka offsets, the pinned consumer groups'
committed offsets), gathered at one instant.

Every reader of a plan gathers here: the purge procedure (one topic, under its write lock:
one marker read, one offsets read, the map and the stats once per step), the ticker and
the API (every topic, or some, with the markers as stored, one scan). The plan itself is
the pure `plan_topic`; `flush_targets` reads the regions worth asking to flush out of the
same inputs.

The stats are copied before Kafka is asked for the offsets, and the plan is told when
Kafka was asked: a stat received before then describes entries Kafka had acknowledged,
so a report above the high watermark - 1 is a topic reset, not a race (`plan_topic`).

The pinned consumer groups (`[wal] pin_consumer_groups`, and the archive's group when the
archive is enabled: DESIGN §8) are read with the offsets, one request per group covering
every topic planned, and every time (a group's offset moves as it reads). A plan whose
groups could not be read has no prune point, like one without Kafka's offsets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from metasrv.errors import KafkaUnavailable, MetasrvError, NotFound
from metasrv.keys import Marker
from metasrv.kv import KeyValue
from metasrv.model import PartitionOffsets, RegionRoute, TopicPlan
from procedures.wal_purge._data import FlushTarget
from procedures.wal_purge._marker import read_marker, read_markers
from procedures.wal_purge._plan import TopicStats, flush_candidates, plan_topic
from procedures.wal_purge._services import PurgeServices

logger = logging.getLogger(__name__)

PLAN_IN_THREAD = 20_000
"""A topic with more regions than this is planned in a worker thread, so the event loop
keeps serving heartbeats meanwhile."""

OFFSETS_WAIT = 5.0
"""Seconds a plan of many topics (the ticker's, the API's) waits for Kafka's offsets; a
topic still unanswered then is planned as Kafka unavailable, so a dead partition leader
costs a plan this long at most."""


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """A topic's plan plus the inputs it was computed from."""

    plan: TopicPlan
    routes: tuple[RegionRoute, ...]
    """Every region mapped to the topic."""
    stats: TopicStats
    """The stats naming the topic when planned (a copy of the registry's rows)."""
    marker: Marker | None = None
    """The stored marker the plan used (None: absent)."""
    marker_kv: KeyValue | None = None
    """The marker's key as read (for a compare-and-swap); only `gather_one` keeps it."""
    offsets: PartitionOffsets | None = None
    """Kafka's offsets the plan used (None: not asked or not answered)."""


def pinned_groups(services: PurgeServices) -> frozenset[str]:
    """The consumer groups whose committed offsets bound every purge (DESIGN §8)."""
    return frozenset(services.settings.wal.pinned_groups)


async def _plan(
    services: PurgeServices,
    topic: str,
    mapped: Mapping[int, RegionRoute],
    marker: Marker | None,
    offsets: PartitionOffsets | None,
    *,
    asked_at: float | None,
    compare_reports: bool = True,
    stats: TopicStats | None = None,
    kafka_error: MetasrvError | None = None,
    marker_kv: KeyValue | None = None,
    committed: Mapping[str, int | None] | None = None,
) -> PlanInputs:
    # Copies: registrations may change the live map while a worker thread plans.
    routes = dict(mapped)
    rows = services.registry.topic_snapshot(topic) if stats is None else stats
    pruned = None if marker is None else marker.pruned_entry_id

    def plan() -> TopicPlan:
        # Stats carry monotonic receive times; `now` must be the same clock.
        return plan_topic(
            topic,
            routes,
            rows,
            now=time.monotonic(),
            stat_ttl=services.settings.wal.region_stat_ttl,
            pruned_entry_id=pruned,
            offsets=offsets,
            marker=marker,
            offsets_asked_at=asked_at,
            compare_reports=compare_reports,
            pinned=committed,
        )

    planned = await asyncio.to_thread(plan) if len(routes) > PLAN_IN_THREAD else plan()
    if kafka_error is None and committed is None and routes and pinned_groups(services):
        # Groups are pinned and their offsets were not read: no cut is safe to name.
        kafka_error = KafkaUnavailable("pinned consumer groups' committed offsets not read")
    if kafka_error is not None:
        # Without Kafka's offsets no cut is safe to name (invariant 6 needs the high
        # watermark, invariant 7 the log start): no prune point, and the reason is Kafka.
        planned = replace(
            planned, prune_point=None, reclaimable_entries=0, kafka_unavailable=str(kafka_error)
        )
    return PlanInputs(planned, tuple(routes.values()), rows, marker, marker_kv, offsets)


async def gather_one(services: PurgeServices, topic: str) -> PlanInputs:
    """One snapshot of `topic`'s inputs and its plan: the marker read once (`DamagedMarker`
    when it does not decode), the stats copied, then Kafka's offsets read once (raises
    `KafkaUnavailable` when Kafka cannot give them, or gives no topic id while the marker
    records one), the map as it is. The purge calls this once per step,
    only while holding the topic's write lock (invariant 4)."""
    marker, marker_kv = await read_marker(services, topic)
    stats = services.registry.topic_snapshot(topic)
    asked_at = time.monotonic()
    offsets, committed = await _offsets_and_committed(services, topic)
    mapped = services.region_map.routes_by_topic().get(topic, {})
    inputs = await _plan(
        services,
        topic,
        mapped,
        marker,
        offsets,
        asked_at=asked_at,
        stats=stats,
        marker_kv=marker_kv,
        committed=committed,
    )
    if inputs.plan.kafka_unavailable is not None:
        # Kafka gave the offsets but not the topic id the marker records (its controller
        # slow after a restart): no step decides without it, since a recreated topic
        # passes every other check. Retried as an outage is, never skipped.
        raise KafkaUnavailable(f"topic {topic}: {inputs.plan.kafka_unavailable}")
    return inputs


async def _offsets_and_committed(
    services: PurgeServices, topic: str
) -> tuple[PartitionOffsets, dict[str, int | None] | None]:
    """Kafka's offsets of `topic` and, when groups are pinned, their committed offsets on
    it, asked at once; raises the first error (`KafkaUnavailable` when retryable)."""
    groups = pinned_groups(services)
    if not groups:
        return await services.batcher.offsets(topic), None
    offsets, committed = await asyncio.gather(
        services.batcher.offsets(topic),
        services.batcher.committed(topic, groups),
        return_exceptions=True,
    )
    for answer in (offsets, committed):
        if isinstance(answer, BaseException):
            raise answer
    assert isinstance(offsets, PartitionOffsets) and isinstance(committed, dict)
    return offsets, committed


async def gather_plans(
    services: PurgeServices,
    topics: Sequence[str] | None = None,
    *,
    with_offsets: bool = True,
    compare_reports: bool | None = None,
) -> dict[str, PlanInputs]:
    """Plan `topics` (default: every topic) from the stored markers (one scan), one batched
    offsets call and the current stats; no locks taken (the ticker's and the API's view).
    A named topic's damaged marker is `DamagedMarker`; in the whole view it reads as absent.
    A topic whose last purge the WAL archive blocked carries why (`not_archived`, from
    `ArchiveVerdicts`: the store is not asked here).

    A named topic that is neither a pool topic nor has regions is `NotFound`. Offsets are
    asked only for topics with regions (a pool topic nobody uses may not exist in Kafka
    yet), for `OFFSETS_WAIT` seconds at most; a topic Kafka gives none for (a dead
    partition leader, a deleted topic) is planned with no prune point and the reason in
    `kafka_unavailable`, and logged.
    Topic by topic, yielding to the event loop in between: planning a million regions at
    once would hold heartbeats for a second.

    `compare_reports` (default: only when `topics` are named) compares every region's
    report with the high watermark (`plan_topic`): a column scan per topic, which would
    double the planning time of a whole-cluster plan (0.09 -> 0.19 ms a topic of 800
    regions). Without it a topic reset shown only by the reports is found by the purge,
    which latches it, and shown by every plan from then on.
    """
    region_map = services.region_map
    known = list(region_map.topics())
    if topics is None:
        names = known
    else:
        known_set = set(known)
        missing = [t for t in topics if t not in known_set]
        if missing:
            raise NotFound(f"unknown topic(s): {', '.join(missing)}", details={"topics": missing})
        names = list(dict.fromkeys(topics))
    compare = topics is not None if compare_reports is None else compare_reports
    # A named topic's plan is decided by its one marker: a damaged one is an error there,
    # never "never purged" (the lists keep `marker_or_none`'s policy).
    markers = await read_markers(services, names if topics is not None else ())
    by_topic = region_map.routes_by_topic()
    offsets: dict[str, PartitionOffsets] = {}
    failed: dict[str, MetasrvError] = {}
    committed: dict[str, dict[str, int | None]] = {}
    used = [t for t in names if by_topic.get(t)] if with_offsets else []
    groups = pinned_groups(services)
    asked_at = time.monotonic()
    if used and groups:
        (offsets, failed), (committed, unread) = await asyncio.gather(
            services.batcher.offsets_tolerant(used, timeout=OFFSETS_WAIT),
            services.batcher.committed_tolerant(used, groups, timeout=OFFSETS_WAIT),
        )
        failed = {**unread, **failed}
    elif used:
        offsets, failed = await services.batcher.offsets_tolerant(used, timeout=OFFSETS_WAIT)
    if failed:
        first = next(iter(failed.values()))
        logger.warning(
            "no Kafka offsets for some topics",
            extra={"topics": sorted(failed), "error": str(first)},
        )
    planned: dict[str, PlanInputs] = {}
    for topic in names:
        mapped = by_topic.get(topic, {})
        planned[topic] = await _plan(
            services,
            topic,
            mapped,
            markers.get(topic),
            offsets.get(topic),
            asked_at=asked_at,
            compare_reports=compare,
            kafka_error=failed.get(topic),
            committed=committed.get(topic),
        )
        blocked = services.archive_verdicts.get(topic)
        if blocked is not None:
            inputs = planned[topic]
            planned[topic] = replace(inputs, plan=replace(inputs.plan, not_archived=blocked.reason))
        await asyncio.sleep(0)
    return planned


def flush_targets(services: PurgeServices, inputs: PlanInputs) -> tuple[FlushTarget, ...]:
    """The plan's regions whose estimated replay bytes exceed `wal.flush_trigger_size`."""
    topic = inputs.plan.topic
    found = flush_candidates(
        inputs.routes,
        inputs.stats,
        topic_stat=services.registry.topic_stat(topic),
        high_watermark=inputs.plan.high_watermark,
        trigger_bytes=services.settings.wal.flush_trigger_size,
    )
    return tuple(
        FlushTarget(route.region_id, row.node_id, row.prunable_entry_id, replay)
        for route, row, replay in found
    )
