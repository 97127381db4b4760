"""Everything one metasrv process runs, built once and torn down in order.

The FastAPI lifespan calls `Runtime.build(settings)`, `await runtime.start()` and, on
shutdown, `await runtime.close()`; nothing else creates clients or engines. Leadership
changes land in `_on_leadership`: stats, instructions and dirty checkpoints are
dropped (DESIGN §2 invariant 3), and a new leader reloads the topic-region map before it
serves heartbeats or writes (`serving`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

from metasrv.election import Election, build_election
from metasrv.errors import MetasrvError, NotLeader, Unavailable
from metasrv.kafka import DurabilityCache, KafkaAdmin, below_configured
from metasrv.kv import KvBackend, open_kv
from metasrv.leader import (
    Checkpointer,
    HeartbeatHandler,
    Mailbox,
    RegionRegistry,
    TopicLocks,
    TopicRegionMap,
)
from metasrv.metrics import Metrics
from metasrv.model import RegionRoute
from metasrv.process import BackgroundTasks, GcPacer, LoopLagMonitor
from metasrv.settings import Settings
from metasrv.stat_history import StatHistoryWriter, cluster_root
from procedures import ProcedureManager
from procedures.wal_purge import PurgeServices, PurgeTicker, purge_manager

logger = logging.getLogger(__name__)

_LOAD_RETRY_MAX = 5.0


def history_url(url: str) -> str:
    """psycopg 3 for plain `postgresql://` URLs (psycopg2 is not installed)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


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
    procedures: ProcedureManager
    """Runs purge procedures on the leader; resumes unfinished ones on election."""
    ticker: PurgeTicker
    """The auto-prune ticker (idle when the interval and the size trigger are both off)."""
    stat_history: StatHistoryWriter | None
    """Region stat snapshots for the reconcile job; None when its interval is 0s."""
    loop_lag: LoopLagMonitor
    """Event-loop lag probe; the leader's watchdog reads it."""
    background: BackgroundTasks
    """Failures of the background loops (counted; a dead one makes /readyz not ready)."""
    gc_pacer: GcPacer = field(default_factory=GcPacer)
    """Young-generation collections in small steps, so none stalls the loop for long."""
    serving: bool = False
    """True while this process leads AND has loaded the map: it may take heartbeats."""
    started_at: float = field(default_factory=time.time)
    """Wall-clock start time."""
    _closed: bool = field(default=False, init=False)
    _pool_task: asyncio.Task[None] | None = field(default=None, init=False)
    _durability_checked: bool = field(default=False, init=False)
    _leadership_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    @classmethod
    def build(cls, settings: Settings, *, addr: str | None = None) -> Runtime:
        """Open every client (no leader work yet). `addr` overrides the advertised address."""
        kv = open_kv(settings)
        try:
            kafka = KafkaAdmin.from_settings(settings.wal)
            locks = TopicLocks()
            metrics = Metrics()
            background = BackgroundTasks(metrics.background_task_errors)
            registry = RegionRegistry()
            loop_lag = LoopLagMonitor(metrics.event_loop_lag)
            election = build_election(
                settings, kv, addr=addr, loop_stalled_for=loop_lag.stalled_for
            )
            region_map = TopicRegionMap(kv, kafka, locks, settings, fence=election.fence)
            mailbox = Mailbox(registry, metrics=metrics)
            checkpointer = Checkpointer(
                region_map,
                registry,
                settings,
                metrics,
                may_write=lambda: election.is_leader,
                on_error=background.sink("checkpointer"),
            )
            region_map.removal_listeners.append(
                lambda route: registry.discard(route.region_id, route.topic)
            )
            region_map.removal_listeners.append(lambda route: checkpointer.discard(route.region_id))
            recon = settings.reconcile
            stat_history = (
                StatHistoryWriter(
                    cluster_root(settings),
                    recon.stat_history_interval,
                    # A follower's view is empty or outdated: it records nothing.
                    lambda: registry.table if election.is_leader else None,
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
            history = create_engine(history_url(settings.history.url))
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
                procedures, settings.wal, on_error=background.sink("ticker")
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
            stat_history=stat_history,
            loop_lag=loop_lag,
            background=background,
        )

    async def start(self) -> None:
        """Start background work and campaign. Our leadership listener is added first, so
        the map is loaded before any later listener (the procedure manager) runs."""
        await self.loop_lag.start()
        await self.gc_pacer.start()
        self.election.add_listener(self._on_leadership)
        await self.checkpointer.start()
        await self.procedures.start()
        await self.ticker.start()
        if self.stat_history is not None:
            await self.stat_history.start()
        await self.election.start()
        watch = self.background.watch
        watch("loop_lag", self.loop_lag.task)
        watch("gc_pacer", self.gc_pacer.task)
        watch("checkpointer", self.checkpointer.task)
        watch("procedure_sweeper", self.procedures.sweeper)
        watch("ticker", self.ticker.task)
        if self.stat_history is not None:
            watch("stat_history", self.stat_history.task)

    async def close(self) -> None:
        """Stop in reverse dependency order; repeat-safe. Checkpoints are flushed while
        this process still leads, before it resigns."""
        if self._closed:
            return
        self._closed = True
        await self._stop_pool_creation()
        if self.stat_history is not None:
            await _quietly(self.stat_history.stop(), "stopping the stat history writer")
        await _quietly(self.ticker.shutdown(), "stopping the purge ticker")
        await _quietly(self.procedures.stop(), "stopping the procedure manager")
        self.purge.close()
        await _quietly(self.checkpointer.stop(), "stopping checkpointer")
        await _quietly(self.election.stop(), "stopping election")
        await self.loop_lag.stop()
        await self.gc_pacer.stop()
        self.serving = False
        self.kafka.close()
        self.kv.close()
        self.history.dispose()

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

    def require_serving(self) -> None:
        """Raise `NotLeader` (421) on a follower, `Unavailable` (503) while loading the map."""
        if not self.election.is_leader:
            raise NotLeader(self.election.leader_addr())
        if not self.serving:
            raise Unavailable("this metasrv just became leader and is loading the topic-region map")

    async def _on_leadership(self, leader: bool) -> None:
        async with self._leadership_lock:
            self.serving = False
            # Stats, instructions and dirty checkpoints of another term are never reused.
            self.registry.clear()
            self.mailbox.clear()
            self.checkpointer.clear()
            self.metrics.is_leader.set(1 if leader else 0)
            await self._stop_pool_creation()
            if not leader:
                self.region_map.unload()
                gc.unfreeze()  # the old term's objects may be collected again
                logger.info("lost leadership")
                return
            delay = 0.25
            while self.election.is_leader and not self._closed:
                try:
                    regions = await self.region_map.load()
                except MetasrvError as exc:
                    logger.warning("loading the topic-region map failed", extra={"error": str(exc)})
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _LOAD_RETRY_MAX)
                    continue
                self.registry.reserve(regions)  # every mapped region reports soon
                # The map's objects live as long as this term: move them (and everything
                # else alive now) out of the collector's reach, so full collections do not
                # walk a million routes while heartbeats wait.
                gc.freeze()
                self.serving = self.election.is_leader
                logger.info("serving as leader", extra={"regions": regions})
                self._pool_task = asyncio.create_task(self._create_pool())
                return

    async def _create_pool(self) -> None:
        """Create the topic pool (`wal.auto_create_topics`; a no-op when off), retrying while
        this process leads, then check the pool's durability once. Heartbeats do not wait
        for it: a registration creates its own topic."""
        delay = 0.5
        while self.election.is_leader and not self._closed:
            try:
                created = await self.region_map.create_pool()
            except MetasrvError as exc:
                logger.warning("creating the topic pool failed", extra={"error": str(exc)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            logger.info("topic pool ready", extra={"topics_created": len(created)})
            await self._check_durability()
            return

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


async def _quietly(awaitable: Any, what: str) -> None:
    try:
        await awaitable
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("%s failed", what)
