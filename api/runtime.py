"""Everything one metasrv process runs, built once and torn down in order.

The FastAPI lifespan calls `Runtime.build(settings)`, `await runtime.start()` and, on
shutdown, `await runtime.close()`; nothing else creates clients or engines. This module
only wires: what a leadership change does is `metasrv.leader.Leadership`, whose hooks are
registered here in the order they run (the leader's view, then the procedures, then the
topic pool).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine, create_engine

from api import topic_reset
from metasrv.election import Election, SingleLeader, build_election
from metasrv.errors import MetasrvError
from metasrv.kafka import DurabilityCache, KafkaAdmin, below_configured
from metasrv.kv import KvBackend, open_kv
from metasrv.leader import (
    Checkpointer,
    HeartbeatHandler,
    Leadership,
    LeaderView,
    Mailbox,
    MapFollower,
    RegionRegistry,
    Role,
    Term,
    TopicLocks,
    TopicRegionMap,
)
from metasrv.metrics import Metrics
from metasrv.model import RegionRoute
from metasrv.process import (
    Backoff,
    GcPacer,
    Jitter,
    LoopLagMonitor,
    Step,
    Supervisor,
    nothing,
)
from metasrv.settings import Settings
from metasrv.sql import engine_url
from metasrv.stat_history import StatHistoryWriter, cluster_root
from procedures import EventRetention, ProcedureManager
from procedures.wal_purge import (
    ArchiveRetention,
    PurgeServices,
    PurgeTicker,
    TrendSampler,
    purge_manager,
)

logger = logging.getLogger(__name__)

POOL_RETRY = Backoff(base=0.5, cap=30.0, jitter=Jitter.NONE)
"""Pauses between two attempts at creating the topic pool: 0.5 s doubling to 30 s."""


@dataclass(eq=False)
class Runtime:
    """The wired components of one process (see module docstring)."""

    settings: Settings
    """Validated configuration."""
    kv: KvBackend
    """etcd or SQL kv backend."""
    kafka: KafkaAdmin
    durability: DurabilityCache
    """WAL topics' effective replication factor and min ISR, read at most once a minute."""
    locks: TopicLocks
    """Per-topic shared/exclusive locks (registration vs purge)."""
    registry: RegionRegistry
    """Leader's in-memory region and topic stats."""
    region_map: TopicRegionMap
    """Topic-region map."""
    mailbox: Mailbox
    """Instructions riding heartbeat responses."""
    checkpointer: Checkpointer
    """Batched checkpoint writer."""
    election: Election
    """Who leads."""
    metrics: Metrics
    """This process's Prometheus series."""
    history: Engine
    """SQLAlchemy engine of `settings.history.url`."""
    heartbeats: HeartbeatHandler
    """The heartbeat hot path."""
    purge: PurgeServices
    """What purges, the ticker and the plan readers use (procedures/wal_purge)."""
    procedures: ProcedureManager[PurgeServices]
    """Runs purge procedures on the leader; resumes unfinished ones on election."""
    ticker: PurgeTicker
    """The auto-prune ticker (idle when the interval and the size trigger are both off)."""
    wal_trend: TrendSampler
    """Retained WAL and purges over the last `[dashboard] window`, for the dashboard."""
    event_retention: EventRetention
    """Deletes WAL events older than `history.events_retention` (while leading)."""
    archive_retention: ArchiveRetention
    """Deletes WAL archive objects past `[wal.archive] retention` (while leading; idle while
    the archive is off or the retention is 0s)."""
    stat_history: StatHistoryWriter | None
    """Region stat snapshots for the reconcile job; None when its interval is 0s."""
    loop_lag: LoopLagMonitor
    """Event-loop lag probe; the leader's watchdog reads it."""
    background: Supervisor
    """Owns every background loop: starts them, counts their failures (a dead one makes
    /readyz not ready, naming it) and drains them on close (`start` registers them)."""
    leadership: Leadership
    """Follower -> elected -> leader, through the hooks `start` registers."""
    follower: MapFollower | None
    """Keeps the topic-region map warm while this process follows (None on a
    single-process SQLite kv, which has no followers)."""
    gauges_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the per-topic plan gauges are refreshed for a scrape (`api.queries`)."""
    gc_pacer: GcPacer = field(default_factory=GcPacer)
    """Young-generation collections in small steps, so none stalls the loop for long."""
    started_at: float = field(default_factory=time.time)
    """Wall-clock start time."""
    _closed: bool = field(default=False, init=False)
    _pool_task: asyncio.Task[None] | None = field(default=None, init=False)
    _view: LeaderView | None = field(default=None, init=False)
    _durability_checked: bool = field(default=False, init=False)

    @classmethod
    def build(cls, settings: Settings, *, addr: str | None = None) -> Runtime:
        """Open every client (no leader work yet). `addr` overrides the advertised address."""
        kv = open_kv(settings)
        try:
            kafka = KafkaAdmin.from_settings(settings.wal)
            locks = TopicLocks()
            metrics = Metrics()
            background = Supervisor(metrics.background_task_errors)
            registry = RegionRegistry()
            loop_lag = LoopLagMonitor(metrics.event_loop_lag)
            election = build_election(
                settings, kv, addr=addr, loop_stalled_for=loop_lag.stalled_for
            )
            region_map = TopicRegionMap(kv, kafka, locks, settings, fence=election.fence)
            mailbox = Mailbox(registry, metrics=metrics)
            # One term for the loops that wait for a new term's first round.
            term = Term(region_map, registry)
            checkpointer = Checkpointer(
                region_map,
                registry,
                settings,
                metrics,
                may_write=lambda: election.is_leader,
                on_error=background.sink("checkpointer"),
                term=term,
            )
            region_map.removal_listeners.append(
                lambda route: registry.discard(route.region_id, route.topic)
            )
            recon = settings.reconcile
            stat_history = (
                StatHistoryWriter(
                    cluster_root(settings),
                    recon.stat_history_interval,
                    # A follower's view is empty or outdated: it records nothing.
                    lambda: registry if election.is_leader else None,
                    retention=recon.stat_history_retention,
                    on_error=background.sink("stat_history"),
                    writer=settings.node_name,
                )
                if recon.stat_history_interval > 0
                else None
            )
            heartbeats = HeartbeatHandler(
                registry,
                region_map,
                mailbox,
                checkpointer,
                metrics,
                leader_addr=election.leader_addr,
                on_misrouted=stat_history.record_rejected if stat_history is not None else None,
            )
            history = create_engine(engine_url(settings.history.url))
            purge = PurgeServices.build(
                kv=kv,
                history=history,
                election=election,
                kafka=kafka,
                registry=registry,
                region_map=region_map,
                mailbox=mailbox,
                locks=locks,
                metrics=metrics,
                settings=settings,
            )
            procedures = purge_manager(purge)
            procedures.on_sweep_error = background.sink("procedure_sweeper")
            ticker = PurgeTicker.from_settings(
                procedures, settings.wal, on_error=background.sink("ticker"), term=term
            )
            leadership = Leadership(
                election,
                on_role=lambda role: metrics.is_leader.set(0 if role is Role.FOLLOWER else 1),
            )
            wal_trend = TrendSampler(
                purge,
                sample_interval=settings.dashboard.sample_interval,
                window=settings.dashboard.window,
                term=lambda: election.term if leadership.serving else None,
                on_error=background.sink("wal_trend"),
            )
            event_retention = EventRetention(
                purge.history,
                settings.history.events_retention,
                leading=lambda: leadership.serving,
                on_error=background.sink("event_retention"),
            )
            archive_retention = ArchiveRetention(
                purge,
                leading=lambda: leadership.serving,
                on_error=background.sink("archive_retention"),
            )
        except BaseException:
            kv.close()
            raise
        return cls(
            settings=settings,
            kv=kv,
            kafka=kafka,
            durability=DurabilityCache(kafka),
            locks=locks,
            registry=registry,
            region_map=region_map,
            mailbox=mailbox,
            checkpointer=checkpointer,
            election=election,
            metrics=metrics,
            history=history,
            heartbeats=heartbeats,
            purge=purge,
            procedures=procedures,
            ticker=ticker,
            wal_trend=wal_trend,
            event_retention=event_retention,
            archive_retention=archive_retention,
            stat_history=stat_history,
            loop_lag=loop_lag,
            background=background,
            leadership=leadership,
            follower=(
                None
                if isinstance(election, SingleLeader)
                else MapFollower(region_map, kv, on_error=background.sink("map_follower"))
            ),
        )

    async def start(self) -> None:
        """Register the leader hooks and every background loop, then start the loops."""
        view = LeaderView(
            self.region_map,
            self.registry,
            self.mailbox,
            self.checkpointer,
            still_leading=lambda: self.election.is_leader and not self._closed,
            follower=self.follower,
        )
        self._view = view
        self.leadership.add_hook("leader view", view.load, view.drop)
        self.leadership.add_hook("procedures", self.procedures.lead, self.procedures.follow)
        self.leadership.add_hook("topic pool", self._start_pool_creation, self._stop_pool_creation)
        # Start order; `close` drains in the reverse one: the loops that write (the purge
        # ticker, procedures, the last WAL events, checkpoints) stop while this process
        # still leads, then it resigns, then the map stops being followed.
        loops = self.background
        loops.add("loop_lag", self.loop_lag)
        loops.add("gc_pacer", self.gc_pacer)
        if self.follower is not None:
            # Warm before any election: a win costs a catch-up. Its health is /readyz's
            # `follower_map`; a take-over ends its task on purpose.
            loops.add("map_follower", Step(self._follow, self.follower.stop), watch=False)
        loops.add("election", Step(self._campaign, self._resign, lambda: self.election.task))
        loops.add("checkpointer", self.checkpointer)
        loops.add("wal_events", Step(nothing, self._write_last_events))
        loops.add("procedure_sweeper", self.procedures)
        loops.add("event_retention", self.event_retention)
        loops.add("archive_retention", self.archive_retention)
        loops.add("wal_trend", self.wal_trend)
        loops.add("ticker", self.ticker)
        if self.stat_history is not None:
            loops.add("stat_history", self.stat_history)
        await loops.start()

    async def close(self) -> None:
        """Stop every background loop in reverse start order, then close the clients;
        repeat-safe. Checkpoints are flushed while this process still leads, before it
        resigns."""
        if self._closed:
            return
        self._closed = True
        await self._stop_pool_creation()
        await self.background.stop()
        self.kafka.close()
        self.kv.close()
        self.history.dispose()

    async def _follow(self) -> None:
        if self.follower is not None:
            self.follower.start()

    async def _campaign(self) -> None:
        await self.leadership.start()
        await self.election.start()

    async def _resign(self) -> None:
        await self.election.stop()
        if self._view is not None:
            self._view.closed = True  # a dropped view is not followed again
        await self.leadership.close()

    async def _write_last_events(self) -> None:
        await self.purge.events.flush(5.0)
        self.purge.close()

    # --- region map changes (leader only; callers check `require_serving`) -----------

    async def register_region(
        self, region_id: int, node_id: int, topic: str | None = None
    ) -> RegionRoute:
        """Map a region to a topic (see `TopicRegionMap.register`)."""
        return await self.region_map.register(region_id, node_id, topic)

    async def deregister_region(self, region_id: int) -> RegionRoute:
        """Unmap a region; its stat and pending checkpoint go with it (removal listeners)."""
        return await self.region_map.deregister(region_id)

    # --- leadership --------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """True while this process leads and its leader hooks are done: it takes heartbeats."""
        return self.leadership.serving

    def require_serving(self) -> None:
        """Raise `NotLeader` (421) on a follower, `Unavailable` (503) while starting to lead."""
        self.leadership.require_serving()

    async def _start_pool_creation(self) -> bool:
        # A task of the term, not of the process: started and stopped by the leader
        # hooks, but a death is reported like a loop's.
        self._pool_task = asyncio.create_task(self._create_pool(), name="topic-pool")
        self.background.watch("topic_pool", self._pool_task)
        return True

    async def _create_pool(self) -> None:
        """Create the topic pool (`wal.auto_create_topics`; a no-op when off), retrying while
        this process leads, then check the pool's durability once. Heartbeats do not wait
        for it: a registration creates its own topic.

        A pool topic Kafka lacks although it has a marker is never created (DESIGN §2
        invariant 8: it was purged, so it was deleted behind metasrv, and a new topic under
        its name would start again at offset 0 and hide the loss): it is reported as a
        topic reset instead (`api.topic_reset.report_missing`)."""
        failures = 0
        while self.election.is_leader and not self._closed:
            try:
                created = await self._create_missing_pool_topics()
            except MetasrvError as exc:
                logger.warning("creating the topic pool failed", extra={"error": str(exc)})
                await asyncio.sleep(POOL_RETRY.delay(failures))
                failures += 1
                continue
            logger.info("topic pool ready", extra={"topics_created": len(created)})
            await self._check_durability()
            return

    async def _create_missing_pool_topics(self) -> list[str]:
        """Create the pool topics Kafka lacks that have no marker; report those that have
        one. Returns the topics created."""
        pool = self.region_map.pool_topics()
        existing = await asyncio.to_thread(self.kafka.list_topics)
        missing = [t for t in pool if t not in existing]
        markers = (
            await asyncio.to_thread(topic_reset.read_markers, self.kv, missing) if missing else {}
        )
        create, withheld = topic_reset.split_pool(pool, existing, markers)
        if not withheld:
            # The map's own pool creation, which also notes the pool as created (a first
            # registration on a pool topic then asks Kafka nothing).
            return await self.region_map.create_pool()
        for topic in withheld:
            await topic_reset.report_missing(self, topic, markers[topic])
        wal = self.settings.wal
        if not create or not wal.auto_create_topics:
            return []
        return await asyncio.to_thread(
            self.kafka.ensure_topics,
            create,
            replication_factor=wal.replication_factor,
            num_partitions=wal.num_partitions,
            config=wal.topic_creation_config(),
            create_timeout=wal.create_topic_timeout,
        )

    async def _check_durability(self) -> None:
        """Warn once per process about pool topics Kafka keeps less durably than `[wal]`
        asks (created before the setting, by another tool, or with a smaller broker
        default)."""
        if self._durability_checked:
            return
        self._durability_checked = True
        wal = self.settings.wal
        pool = self.region_map.pool_topics()
        found = await asyncio.to_thread(self.durability.get, pool, refresh=True)
        short = below_configured(
            found,
            replication_factor=wal.replication_factor,
            min_insync_replicas=wal.wanted_min_insync_replicas,
        )
        if short:
            logger.warning(
                "%d WAL topic(s) are less durable than [wal] configures: %s",
                len(short),
                "; ".join(f"{t}: {why}" for t, why in short.items()),
                extra={"topics": sorted(short)},
            )

    async def _stop_pool_creation(self) -> None:
        task, self._pool_task = self._pool_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
