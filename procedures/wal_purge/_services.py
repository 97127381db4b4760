"""What the WAL purge uses from the rest of metasrv, and the one place it is assembled.

The metadata plane (registry, region_map, mailbox) lives in `metasrv/`; the purge depends
only on the methods named here, so its pure tests can use small doubles while
integration tests and the daemon pass the real objects.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import Engine

from metasrv.kafka import KafkaAdmin
from metasrv.kv import KvBackend
from metasrv.leader import TopicLocks
from metasrv.metrics import Metrics
from metasrv.model import RegionRoute, TopicStat
from metasrv.settings import Settings
from procedures import EventLog, GroupCommitter, History, LeaderFence, ProcedureStore
from procedures.wal_purge._archive_verdicts import ArchiveVerdicts
from procedures.wal_purge._batcher import KafkaBatcher
from procedures.wal_purge._plan import TopicStats


class StatSource(Protocol):
    """The leader's in-memory region and topic stats (`metasrv.leader.RegionRegistry`)."""

    def topic_snapshot(self, topic: str) -> TopicStats:
        """Latest stat of every region that reported on `topic`, as of now (a copy of one
        topic's rows: later heartbeats do not show)."""
        ...

    def topic_stat(self, topic: str) -> TopicStat | None:
        """What datanodes last said about `topic`."""
        ...

    def __len__(self) -> int:
        """Regions with a stat in this term."""
        ...

    def topic_stats(self) -> dict[str, TopicStat]:
        """`topic_stat` of every topic reported on."""
        ...


class TopicMap(Protocol):
    """The topic-region map (metasrv/leader/_region_map.py)."""

    @property
    def loaded(self) -> bool:
        """False until this leader has read the whole map (nothing may be planned before)."""
        ...

    def __len__(self) -> int:
        """Mapped regions."""
        ...

    def topics(self) -> Sequence[str]:
        """Every WAL topic."""
        ...

    def regions_of(self, topic: str) -> list[RegionRoute]:
        """Every region mapped to `topic`."""
        ...

    def routes_by_topic(self) -> Mapping[str, Mapping[int, RegionRoute]]:
        """Topic -> region id -> route, for every topic with regions."""
        ...

    async def pruned_entry_ids(self) -> Mapping[str, int | None]:
        """Every topic's stored `pruned_entry_id` marker."""
        ...


class FlushMailbox(Protocol):
    """Instructions to datanodes, delivered in heartbeat responses (metasrv/leader/_mailbox.py)."""

    def send_flush(self, node_id: int, region_ids: Iterable[int], *, ttl: float) -> str:
        """Queue a `flush_regions` instruction; return its id."""
        ...


@dataclass(frozen=True, slots=True)
class PurgeServices:
    """Everything a purge step, the ticker and the plan readers use."""

    kv: KvBackend
    history: History
    events: EventLog
    """WAL events (prune attempts, data loss), written to `history` in the background."""
    election: LeaderFence
    kafka: KafkaAdmin
    """Kafka admin adapter (blocking)."""
    batcher: KafkaBatcher
    """Async, coalescing front of `kafka`."""
    registry: StatSource
    region_map: TopicMap
    mailbox: FlushMailbox
    locks: TopicLocks
    """Per-topic read/write locks (registration vs purge)."""
    metrics: Metrics
    settings: Settings
    executor: concurrent.futures.ThreadPoolExecutor
    """Thread pool for blocking kv calls (procedure records and markers)."""
    committer: GroupCommitter
    """Merges concurrent kv transactions (see procedures/_group_commit.py)."""
    archive_verdicts: ArchiveVerdicts = field(default_factory=ArchiveVerdicts)
    """The purge's last blocking archive check per topic (`_coverage.py`), for the plans."""

    @classmethod
    def build(
        cls,
        *,
        kv: KvBackend,
        history: Engine,
        election: LeaderFence,
        kafka: KafkaAdmin,
        registry: StatSource,
        region_map: TopicMap,
        mailbox: FlushMailbox,
        locks: TopicLocks,
        metrics: Metrics,
        settings: Settings,
        kv_threads: int = 16,
        batch_window: float = 0.005,
    ) -> PurgeServices:
        """Wire the purge's own plumbing (kv pool, group commit, Kafka batching) around
        the process's components. `close()` releases the kv pool."""
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=kv_threads, thread_name_prefix="procedure-kv"
        )
        sql_history = History(history)
        return cls(
            kv=kv,
            history=sql_history,
            events=EventLog(sql_history, metrics.wal_events_dropped),
            election=election,
            kafka=kafka,
            batcher=KafkaBatcher(kafka, window=batch_window),
            registry=registry,
            region_map=region_map,
            mailbox=mailbox,
            locks=locks,
            metrics=metrics,
            settings=settings,
            executor=executor,
            committer=GroupCommitter(kv, executor),
        )

    def procedure_store(self) -> ProcedureStore:
        """Procedure records in the same kv, through the same pool and group commit."""
        return ProcedureStore(
            self.kv, self.election.fence, executor=self.executor, committer=self.committer
        )

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
