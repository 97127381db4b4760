"""Read-side answers the API serves: region and topic views, replay start, prune plans.

None of them changes state. Plans come from `procedures.wal_purge.gather_plans`, the
same gathering the ticker uses, so the API shows the P a purge would use. Replay start
also names the WAL archive's objects a region replays before Kafka (DESIGN §8, "Restore").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from api.runtime import Runtime
from metasrv import keys
from metasrv.errors import MetasrvError, NotFound, TopicReset
from metasrv.keys import ELECTION_KEY, Marker, ResetLatch
from metasrv.model import (
    PartitionOffsets,
    RegionRoute,
    RegionStat,
    TopicDurability,
    TopicPlan,
    TopicStat,
    replay_start_entry_id,
)
from metasrv.settings import ArchiveSettings
from metasrv.sql import require_schema
from procedures.wal_purge import (
    PurgeData,
    WalPurge,
    covering_chain,
    export_gauges,
    gather_plans,
    plan_topic,
)

if TYPE_CHECKING:
    from metasrv.archive import ArchivedRange

logger = logging.getLogger(__name__)

_READY_TIMEOUT = 5.0
_DURABILITY_TIMEOUT = 5.0
_REPLAY_KAFKA_WAIT = 1.0
"""Seconds replay-start waits for Kafka's offsets (its log start, and a reset not latched
yet; datanodes ask with a 3 s timeout)."""
_REPLAY_STORE_WAIT = 1.5
"""Seconds replay-start waits for the archive's listing of a topic, asked only when the
start is below Kafka's log start; past it the store counts as unreachable (503)."""
_KAFKA_PING_TIMEOUT = 4.0
"""The Kafka check's own budget, inside `_READY_TIMEOUT`: a dead partition leader makes it
answer "unreachable" rather than time out."""


@dataclass(frozen=True, slots=True)
class ArchiveObject:
    """One object of the WAL archive a region replays, in `bucket` at `key`."""

    bucket: str
    key: str
    entries: ArchivedRange


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """Where a restarting region replays its WAL from."""

    region_id: int
    topic: str
    start_entry_id: int
    """`max(prunable_entry_id, pruned_entry_id, in-flight purge target) + 1` (DESIGN §1
    with the prunable id for the flushed one; `metasrv.model.replay_start_entry_id`)."""
    log_start_offset: int | None = None
    """Kafka's log start of the topic's partition 0; None when Kafka did not answer in
    `_REPLAY_KAFKA_WAIT`."""
    archive: tuple[ArchiveObject, ...] | None = None
    """The archive's objects holding [start_entry_id, log_start_offset), in entry order,
    when the start is below the log start and the archive covers that range; else None."""


@dataclass(frozen=True, slots=True)
class RegionView:
    """A region's route with what the leader knows about it now."""

    route: RegionRoute
    """Mapped topic, registering node, last checkpoint."""
    stat: RegionStat | None
    """Latest heartbeat stat for the mapped topic, if any since this leader took over."""
    stat_age: float | None
    """Seconds since that stat arrived."""
    pruned_entry_id: int | None
    """The topic's last completed purge point."""
    replay_start_entry_id: int
    """Where the region would replay from now."""


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic's regions, stats and prune plan."""

    plan: TopicPlan
    """The topic's prune plan now (includes region count, blockers, data loss, offsets)."""
    stat: TopicStat | None
    """Latest datanode report on the topic (latest entry id, average record size)."""
    pool: bool
    """True for a `{prefix}_{n}` pool topic."""
    durability: TopicDurability | None = None
    """Kafka's replication factor and min ISR of the topic; None when Kafka has no such
    topic or did not answer."""


def _live_stat(rt: Runtime, route: RegionRoute) -> RegionStat | None:
    # Only a stat naming the route's topic is this route's.
    return rt.registry.get(route.region_id, route.topic)


def _route(rt: Runtime, region_id: int) -> RegionRoute:
    route = rt.region_map.route(region_id)
    if route is None:
        raise NotFound(f"region {region_id} is not registered", details={"region_id": region_id})
    return route


async def replay_start(rt: Runtime, region_id: int) -> ReplayStart:
    """The entry id region `region_id` must replay from; `NotFound` if unregistered.

    No offset is answered from a marker that has a topic reset latched, or whose topic
    Kafka shows reset now (`TopicReset`, 409: the marker's offsets belong to a topic that
    is gone, DESIGN §2 invariant 8), or that does not decode (`DamagedMarker`, 500:
    "never purged" would be a guess).

    Never below the target of a purge of the topic in flight (`_in_flight_target`): the
    region's stat may have dropped below it after the purge step re-validated, and its
    marker write and DeleteRecords may land after this answer (issue #34). Read in this
    order: the stat, then the purge in flight, then the marker again; a purge that
    finished in between has moved the marker before the second read, and one whose intent
    is persisted after the stat was read re-validates against that stat or a later one.

    Kafka's log start comes with the answer (None when Kafka is slow: then no archive is
    named). Only a start below it reads the archive (one listing of the topic's objects):
    `archive` names the objects covering [start, log start), or None when the archive is
    disabled or has a gap; a store that does not answer is `ObjectStoreUnavailable` (503),
    never a null that would read as "not archived"."""
    route = _route(rt, region_id)
    marker = await _marker(rt, route.topic)
    if marker.reset is not None:
        raise _reset_error(route.topic, marker.reset)
    offsets = await _replay_offsets(rt, route.topic)
    unlatched = _unlatched_reset(rt, route.topic, marker, offsets)
    if unlatched is not None:
        raise _reset_error(route.topic, ResetLatch(unlatched))
    # Re-read after the await: the stat may have changed meanwhile.
    route = _route(rt, region_id)
    stat = _live_stat(rt, route)
    in_flight = await _in_flight_target(rt, route.topic)
    marker = await _marker(rt, route.topic)
    if marker.reset is not None:
        raise _reset_error(route.topic, marker.reset)
    if in_flight is not None:
        await _check_purge_topic(rt, route.topic)
    start = replay_start_entry_id(
        stat, route.checkpoint_entry_id, marker.pruned_entry_id, in_flight
    )
    log_start = None if offsets is None else offsets.log_start_offset
    archive = None
    settings = rt.settings.wal.archive
    if settings.enabled and log_start is not None and start < log_start:
        archive = await _archive_objects(settings, route.topic, start, log_start)
    return ReplayStart(
        region_id=region_id,
        topic=route.topic,
        start_entry_id=start,
        log_start_offset=log_start,
        archive=archive,
    )


async def _replay_offsets(rt: Runtime, topic: str) -> PartitionOffsets | None:
    """Kafka's offsets of `topic` now, through the purge's batcher (replay starts asked
    together share one request); None when Kafka does not answer within
    `_REPLAY_KAFKA_WAIT` (replay start is then answered from the marker alone)."""
    try:
        return await asyncio.wait_for(rt.purge.batcher.offsets(topic), _REPLAY_KAFKA_WAIT)
    except (TimeoutError, MetasrvError) as exc:
        logger.warning(
            "replay start answered without Kafka's offsets",
            extra={"topic": topic, "error": str(exc)},
        )
        return None


async def _archive_objects(
    settings: ArchiveSettings, topic: str, start: int, end: int
) -> tuple[ArchiveObject, ...] | None:
    """The archived objects of `topic` that hold [start, end), in entry order, or None
    when there is a gap: one listing of the topic's prefix (`covering_chain`).
    `ObjectStoreUnavailable` when the store does not answer within `_REPLAY_STORE_WAIT`."""
    chain = await covering_chain(settings, topic, start, end, timeout=_REPLAY_STORE_WAIT)
    if chain is None:
        logger.warning(
            "replay start below Kafka's log start and the archive has a gap there",
            extra={"topic": topic, "start": start, "log_start": end},
        )
        return None
    bucket, prefix = settings.bucket, settings.prefix
    return tuple(ArchiveObject(bucket, r.key(prefix), r) for r in chain)


async def _in_flight_target(rt: Runtime, topic: str) -> int | None:
    """The persisted target (`PurgeData.target`, the purge step's intent) of the purge of
    `topic` that has not finished, if one has got that far. From the leader's procedure
    manager, which holds every unfinished procedure record (it resumed those of earlier
    terms before this process served) and each save of one as soon as it is stored."""
    procedures = rt.procedures
    procedure_id = procedures.in_flight(topic)
    if procedure_id is None:
        return None
    try:
        view = await procedures.get(procedure_id)
    except NotFound:
        return None  # finished and forgotten meanwhile: its marker write has landed
    if view.kind != WalPurge.kind or view.state.terminal:
        return None
    return PurgeData.from_json(view.data).target


async def _check_purge_topic(rt: Runtime, topic: str) -> None:
    """`TopicReset` when the purge of `topic` in flight planned on a Kafka topic id that is
    not Kafka's now: its target counts offsets of a topic that is gone, and a floor taken
    from it would skip the new topic's entries. Best effort, as `_unlatched_reset`."""
    procedure_id = rt.procedures.in_flight(topic)
    if procedure_id is None:
        return
    try:
        view = await rt.procedures.get(procedure_id)
    except NotFound:
        return
    planned = PurgeData.from_json(view.data).topic_id
    if planned is None:
        return
    try:
        offsets = await asyncio.wait_for(rt.purge.batcher.offsets(topic), _REPLAY_KAFKA_WAIT)
    except (TimeoutError, MetasrvError) as exc:
        logger.warning(
            "replay start answered without Kafka's topic id",
            extra={"topic": topic, "error": str(exc)},
        )
        return
    if offsets.topic_id is not None and offsets.topic_id != planned:
        raise _reset_error(
            topic,
            ResetLatch(
                f"topic_id_changed: a purge in flight planned on topic id {planned}; "
                f"Kafka's is {offsets.topic_id}",
                offsets.topic_id,
                offsets.high_watermark,
            ),
        )


async def _marker(rt: Runtime, topic: str) -> Marker:
    """The topic's stored marker (an empty one when it was never purged)."""
    stored = await asyncio.to_thread(rt.kv.get, keys.topic_name(topic))
    return Marker() if stored is None else keys.read_marker(stored.key, stored.value)


def _unlatched_reset(
    rt: Runtime, topic: str, marker: Marker, offsets: PartitionOffsets | None
) -> str | None:
    """Why `topic` is a reset no purge has latched yet (the marker's topic id is not
    Kafka's, or Kafka's high watermark is below the marker + 1: the planner's rule,
    `plan_topic`), or None. Best effort: without Kafka's `offsets` (it did not answer in
    time) the marker alone answers, as before."""
    if marker.pruned_entry_id is None and marker.topic_id is None:
        return None  # nothing of an older topic to compare Kafka's offsets with
    if offsets is None:
        return None
    plan = plan_topic(
        topic,
        {},
        rt.registry.topic_snapshot(topic),
        now=time.monotonic(),
        stat_ttl=rt.settings.wal.region_stat_ttl,
        pruned_entry_id=marker.pruned_entry_id,
        offsets=offsets,
        marker=marker,
        compare_reports=False,
    )
    return plan.topic_reset


def _reset_error(topic: str, reset: ResetLatch) -> TopicReset:
    return TopicReset(
        f"topic {topic} is a topic reset ({reset.reason}): it was deleted and recreated or "
        f"truncated under metasrv, so the WAL entries its marker and regions refer to are "
        f"gone; no replay start is answered until an operator resolves it (rebuild the "
        f"topic's regions from their own storage, then `metasrv topic resolve-reset "
        f"{topic} --topic-id <Kafka's topic id>`)",
        details={
            "topic": topic,
            "reason": reset.reason,
            "detected_topic_id": reset.detected_topic_id,
            "high_watermark": reset.high_watermark,
        },
    )


async def region_view(rt: Runtime, region_id: int) -> RegionView:
    """Route + latest stat + replay start of one region; `NotFound` if unregistered,
    `DamagedMarker` when its topic's marker does not decode (`keys.read_marker`: the replay
    start shown here is decided by that one marker, as replay-start's is)."""
    route = _route(rt, region_id)
    pruned = (await _marker(rt, route.topic)).pruned_entry_id
    route = _route(rt, region_id)
    stat = _live_stat(rt, route)
    in_flight = await _in_flight_target(rt, route.topic)
    return RegionView(
        route=route,
        stat=stat,
        stat_age=None if stat is None else max(0.0, time.monotonic() - stat.received_at),
        pruned_entry_id=pruned,
        replay_start_entry_id=replay_start_entry_id(
            stat, route.checkpoint_entry_id, pruned, in_flight
        ),
    )


async def region_views(rt: Runtime, topic: str | None, limit: int) -> list[RegionView]:
    """Up to `limit` regions (of `topic`, or all), ordered by region id."""
    pruned = await rt.region_map.pruned_entry_ids()
    routes: Iterable[RegionRoute] = (
        rt.region_map.regions_of(topic) if topic is not None else rt.region_map.routes.values()
    )
    # `route()` carries the latest checkpoint and node; the listing's routes may not.
    chosen = [
        rt.region_map.route(r.region_id) or r
        for r in sorted(routes, key=lambda r: r.region_id)[:limit]
    ]
    now = time.monotonic()
    in_flight = {t: await _in_flight_target(rt, t) for t in {r.topic for r in chosen}}
    views = []
    for route in chosen:
        stat = _live_stat(rt, route)
        marker = pruned.get(route.topic)
        views.append(
            RegionView(
                route=route,
                stat=stat,
                stat_age=None if stat is None else max(0.0, now - stat.received_at),
                pruned_entry_id=marker,
                replay_start_entry_id=replay_start_entry_id(
                    stat, route.checkpoint_entry_id, marker, in_flight[route.topic]
                ),
            )
        )
    return views


async def compute_plans(rt: Runtime, topics: Sequence[str] | None = None) -> dict[str, TopicPlan]:
    """Prune plans of `topics` (default: every topic) now; `NotFound` for a named topic
    that is neither a pool topic nor has regions (see `gather_plans`)."""
    planned = await gather_plans(rt.purge, topics)
    return {topic: inputs.plan for topic, inputs in planned.items()}


async def topic_views(rt: Runtime, topics: Sequence[str] | None = None) -> list[TopicView]:
    """Every topic (or the named ones) with its plan, latest datanode report and durability
    (the cached view for a listing; read afresh when topics are named)."""
    plans = await compute_plans(rt, topics)
    pool = set(rt.region_map.pool_topics())
    durability = await asyncio.to_thread(
        rt.durability.get, list(plans), refresh=topics is not None, timeout=_DURABILITY_TIMEOUT
    )
    return [
        TopicView(
            plan=plan,
            stat=rt.registry.topic_stat(topic),
            pool=topic in pool,
            durability=durability.get(topic),
        )
        for topic, plan in plans.items()
    ]


PLAN_GAUGES_SHARE = 0.1
"""The most of the leader's time scrapes spend planning: a scrape plans anew only when
the gauges are older than the last scrape's planning took, divided by this. Planning
every topic takes a few milliseconds for a small map (every scrape plans) and about a
second at a million regions while a new term's first reports arrive (scrapes then share
one plan for ten seconds), so Prometheus servers, dashboards and operators scraping
every few seconds never hold the heartbeats for long."""


async def refresh_metrics(rt: Runtime) -> None:
    """Refresh per-topic gauges on the leader unless they are fresh enough
    (`PLAN_GAUGES_SHARE`; one refresh at a time: a scrape arriving during one waits for
    it); Kafka or kv trouble only skips the refresh."""
    if not rt.serving:
        return
    metrics = rt.metrics
    async with rt.gauges_lock:
        started = time.monotonic()
        if started - metrics.plan_gauges_at < metrics.plan_gauges_cost / PLAN_GAUGES_SHARE:
            return
        try:
            plans = await compute_plans(rt)
        except MetasrvError as exc:
            logger.warning("metrics refresh skipped", extra={"error": str(exc)})
            return
        export_gauges(metrics, plans, rt.registry.topic_stats())
        metrics.plan_gauges_cost = time.monotonic() - started


async def readiness(rt: Runtime) -> dict[str, str]:
    """`{"kv", "kafka", "history", "background_tasks"}`, each "ok" or why not: kv reachable,
    Kafka's offsets of every WAL topic readable (metadata, a live leader for each partition,
    partition 0's offsets: `KafkaAdmin.ping`), the history database migrated to the newest
    schema, no background task dead; all must hold to be ready.

    The answer needs no token, so it names the failing store, never its address or user:
    kv and Kafka errors are logged and answered as "unreachable" (the history check's own
    messages carry no address: metasrv/sql/_check.py).
    """

    def kv_check() -> None:
        rt.kv.get(ELECTION_KEY)

    def history_check() -> None:
        require_schema(rt.history, "history")

    wal_topics = rt.region_map.topics()  # on the loop: the map changes only there

    def kafka_check() -> None:
        rt.kafka.ping(wal_topics, timeout=_KAFKA_PING_TIMEOUT)

    async def check(
        fn: Callable[[], object], name: str, *, say_why: bool = False
    ) -> tuple[str, str]:
        try:
            await asyncio.wait_for(asyncio.to_thread(fn), _READY_TIMEOUT)
        except TimeoutError:
            logger.warning("readiness: %s timed out", name)
            return name, f"timed out after {_READY_TIMEOUT:g}s"
        except MetasrvError as exc:
            logger.warning("readiness: %s not ready: %s", name, exc)
            return name, str(exc) if say_why else "unreachable"
        return name, "ok"

    results = dict(
        await asyncio.gather(
            check(kv_check, "kv"),
            check(kafka_check, "kafka"),
            check(history_check, "history", say_why=True),
        )
    )
    dead = rt.background.dead()
    results["background_tasks"] = f"dead: {', '.join(dead)}" if dead else "ok"
    return results
