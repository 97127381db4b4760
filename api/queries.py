"""Read-side answers the API serves: region and topic views, replay start, prune plans.

Each function gathers its inputs from the runtime at one instant and computes with the
pure planner; none of them changes state. Kafka offsets are fetched with one batched
call per answer, and only for topics that have regions (a pool topic nobody uses may
not exist in Kafka yet).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from api.runtime import Runtime
from metasrv.errors import MetasrvError, NotFound
from metasrv.kafka import KafkaAdmin
from metasrv.keys import ELECTION_KEY
from metasrv.metrics import Metrics
from metasrv.model import PartitionOffsets, RegionRoute, RegionStat, TopicPlan, TopicStat
from metasrv.prune_plan import plan_topics
from metasrv.schema_check import require_schema

logger = logging.getLogger(__name__)

_PLAN_IN_THREAD = 20_000
"""Above this many regions the plan runs in a worker thread so the loop keeps serving."""

_READY_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """Where a restarting region replays its WAL from."""

    region_id: int
    """Region."""
    topic: str
    """Its mapped topic."""
    start_entry_id: int
    """`max(flushed_entry_id, pruned_entry_id) + 1` (DESIGN §1)."""


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


def _live_stat(rt: Runtime, route: RegionRoute) -> RegionStat | None:
    # Only a stat naming the route's topic is this route's.
    return rt.registry.get(route.region_id, route.topic)


def _replay_start(route: RegionRoute, stat: RegionStat | None, pruned: int | None) -> int:
    if stat is not None:
        flushed = stat.flushed_entry_id
    elif route.checkpoint_entry_id is not None:
        flushed = route.checkpoint_entry_id
    else:
        flushed = -1
    return max(flushed, pruned if pruned is not None else -1) + 1


def _route(rt: Runtime, region_id: int) -> RegionRoute:
    route = rt.topology.route(region_id)
    if route is None:
        raise NotFound(f"region {region_id} is not registered", details={"region_id": region_id})
    return route


async def replay_start(rt: Runtime, region_id: int) -> ReplayStart:
    """The entry id region `region_id` must replay from; `NotFound` if unregistered."""
    route = _route(rt, region_id)
    pruned = await rt.topology.pruned_entry_id(route.topic)
    # Re-read after the await: the stat may have advanced meanwhile (never backwards).
    route = _route(rt, region_id)
    start = _replay_start(route, _live_stat(rt, route), pruned)
    return ReplayStart(region_id=region_id, topic=route.topic, start_entry_id=start)


async def region_view(rt: Runtime, region_id: int) -> RegionView:
    """Route + latest stat + replay start of one region; `NotFound` if unregistered."""
    route = _route(rt, region_id)
    pruned = await rt.topology.pruned_entry_id(route.topic)
    route = _route(rt, region_id)
    stat = _live_stat(rt, route)
    return RegionView(
        route=route,
        stat=stat,
        stat_age=None if stat is None else max(0.0, time.monotonic() - stat.received_at),
        pruned_entry_id=pruned,
        replay_start_entry_id=_replay_start(route, stat, pruned),
    )


async def region_views(rt: Runtime, topic: str | None, limit: int) -> list[RegionView]:
    """Up to `limit` regions (of `topic`, or all), ordered by region id."""
    pruned = await rt.topology.pruned_entry_ids()
    routes: Iterable[RegionRoute] = (
        rt.topology.regions_of(topic) if topic is not None else rt.topology.routes.values()
    )
    # `route()` carries the latest checkpoint and node; the listing's routes may not.
    chosen = [
        rt.topology.route(r.region_id) or r
        for r in sorted(routes, key=lambda r: r.region_id)[:limit]
    ]
    now = time.monotonic()
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
                replay_start_entry_id=_replay_start(route, stat, marker),
            )
        )
    return views


def fetch_offsets(kafka: KafkaAdmin, topics: Sequence[str]) -> dict[str, PartitionOffsets]:
    """Offsets of `topics` in one batched call; topics missing from Kafka are left out."""
    if not topics:
        return {}
    try:
        return kafka.offsets(topics)
    except NotFound:
        # Someone deleted a topic under us: ask again for those that exist.
        existing = kafka.list_topics()
        return kafka.offsets([t for t in topics if t in existing])


async def compute_plans(
    rt: Runtime, topics: Sequence[str] | None = None, *, with_offsets: bool = True
) -> dict[str, TopicPlan]:
    """Prune plans of `topics` (default: every topic) from the current map and stats.

    A named topic that is neither a pool topic nor has regions is `NotFound`.
    """
    topology = rt.topology
    known = topology.topics()
    if topics is None:
        names = known
    else:
        known_set = set(known)
        missing = [t for t in topics if t not in known_set]
        if missing:
            raise NotFound(f"unknown topic(s): {', '.join(missing)}", details={"topics": missing})
        names = list(topics)
    pruned = await topology.pruned_entry_ids()
    offsets: dict[str, PartitionOffsets] | None = None
    if with_offsets:
        used = [t for t in names if topology.region_count(t)]
        offsets = await asyncio.to_thread(fetch_offsets, rt.kafka, used)
    # From here to the plan there is no await: map and stats are one instant's view.
    wanted = set(names)
    routes = {t: dict(r) for t, r in topology.routes_by_topic().items() if t in wanted}
    registry = rt.registry
    # One topic: copy only its rows (a full snapshot copies every region's).
    stats: Mapping[int, RegionStat] = (
        registry.topic_snapshot(names[0]) if len(names) == 1 else registry.snapshot()
    )
    regions = sum(len(r) for r in routes.values())
    now = time.monotonic()
    ttl = rt.settings.wal.region_stat_ttl

    def plan() -> dict[str, TopicPlan]:
        return plan_topics(
            routes,
            stats,
            now=now,
            stat_ttl=ttl,
            pruned_entry_ids=pruned,
            offsets=offsets,
            topics=names,
        )

    if regions > _PLAN_IN_THREAD:
        return await asyncio.to_thread(plan)
    return plan()


async def topic_views(rt: Runtime, topics: Sequence[str] | None = None) -> list[TopicView]:
    """Every topic (or the named ones) with its plan and latest datanode report."""
    plans = await compute_plans(rt, topics)
    pool = set(rt.topology.pool_topics())
    return [
        TopicView(plan=plan, stat=rt.registry.topic_stat(topic), pool=topic in pool)
        for topic, plan in plans.items()
    ]


def refresh_gauges(
    metrics: Metrics, plans: Mapping[str, TopicPlan], topic_stats: Mapping[str, TopicStat]
) -> None:
    """Set the per-topic gauges from a plan (called on every `/metrics` scrape)."""
    for topic, plan in plans.items():
        metrics.prune_point.labels(topic).set(-1 if plan.prune_point is None else plan.prune_point)
        metrics.blocked_regions.labels(topic).set(len(plan.blocked_by))
        if plan.pruned_entry_id is not None:
            metrics.pruned_entry_id.labels(topic).set(plan.pruned_entry_id)
            lag = 0 if plan.prune_point is None else max(0, plan.prune_point - plan.pruned_entry_id)
            metrics.purge_lag_entries.labels(topic).set(lag)
        if plan.log_start_offset is not None and plan.high_watermark is not None:
            metrics.log_start_offset.labels(topic).set(plan.log_start_offset)
            metrics.high_watermark.labels(topic).set(plan.high_watermark)
            retained = max(0, plan.high_watermark - plan.log_start_offset)
            metrics.retained_entries.labels(topic).set(retained)
            stat = topic_stats.get(topic)
            if stat is not None:
                metrics.retained_bytes.labels(topic).set(retained * stat.avg_record_size)


async def refresh_metrics(rt: Runtime) -> None:
    """Refresh per-topic gauges on the leader; Kafka or kv trouble only skips the refresh."""
    if not rt.serving:
        return
    try:
        plans = await compute_plans(rt)
    except MetasrvError as exc:
        logger.warning("metrics refresh skipped", extra={"error": str(exc)})
        return
    refresh_gauges(rt.metrics, plans, rt.registry.topic_stats())


async def readiness(rt: Runtime) -> dict[str, str]:
    """`{"kv", "kafka", "history", "background_tasks"}`, each "ok" or why not: kv and Kafka
    reachable, the history database migrated to the newest schema, no background task
    dead; all must hold to be ready.

    The answer needs no token, so it names the failing store, never its address or user:
    kv and Kafka errors are logged and answered as "unreachable" (the history check's own
    messages carry no address: metasrv/schema_check.py).
    """

    def kv_check() -> None:
        rt.kv.get(ELECTION_KEY)

    def history_check() -> None:
        require_schema(rt.history, "history")

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
            check(rt.kafka.ping, "kafka"),
            check(history_check, "history", say_why=True),
        )
    )
    dead = rt.background.dead()
    results["background_tasks"] = f"dead: {', '.join(dead)}" if dead else "ok"
    return results
