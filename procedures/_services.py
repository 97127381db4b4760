"""What procedures need from the rest of metasrv, as structural protocols.

The metadata plane (registry, topology, mailbox) and the election live in `metasrv/`;
procedures depend only on these few methods, so the framework's pure tests can use
small doubles while integration tests and the daemon pass the real objects.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from metasrv.kafka import KafkaAdmin
from metasrv.kv import Compare, KvBackend
from metasrv.locks import TopicLocks
from metasrv.metrics import Metrics
from metasrv.model import RegionRoute, RegionStat, TopicStat
from metasrv.settings import Settings
from procedures._batcher import KafkaBatcher
from procedures._group_commit import GroupCommitter
from procedures._history import History


class LeaderFence(Protocol):
    """The election as procedures see it."""

    @property
    def is_leader(self) -> bool:
        """True while this process leads."""
        ...

    def fence(self) -> list[Compare]:
        """Kv compares that hold only while this process leads (added to every write)."""
        ...

    def leader_addr(self) -> str | None:
        """HTTP address of the current leader, if known (for `NotLeader`)."""
        ...


class StatSource(Protocol):
    """The leader's in-memory region and topic stats (metasrv/registry.py)."""

    def snapshot(self) -> Mapping[int, RegionStat]:
        """Latest stat of every region that reported to this leader."""
        ...

    def topic_snapshot(self, topic: str) -> Mapping[int, RegionStat]:
        """Latest stat of every region that reported on `topic` (cheap: one topic's rows)."""
        ...

    def topic_stat(self, topic: str) -> TopicStat | None:
        """What datanodes last said about `topic`."""
        ...


class TopicMap(Protocol):
    """The topic-region map (metasrv/topology.py)."""

    def topics(self) -> Sequence[str]:
        """Every WAL topic."""
        ...

    def regions_of(self, topic: str) -> list[RegionRoute]:
        """Every region mapped to `topic`."""
        ...

    async def pruned_entry_ids(self) -> Mapping[str, int | None]:
        """Every topic's stored `pruned_entry_id` marker."""
        ...


class FlushMailbox(Protocol):
    """Instructions to datanodes, delivered in heartbeat responses (metasrv/mailbox.py)."""

    def send_flush(self, node_id: int, region_ids: Iterable[int], *, ttl: float) -> str:
        """Queue a `flush_regions` instruction; return its id."""
        ...


@dataclass(frozen=True, slots=True)
class Services:
    """Everything a procedure step may use; built once by the manager."""

    kv: KvBackend
    """The kv backend (etcd or SQL)."""
    history: History
    """SQL history store."""
    election: LeaderFence
    """Leadership and the write fence."""
    kafka: KafkaAdmin
    """Kafka admin adapter (blocking)."""
    batcher: KafkaBatcher
    """Async, coalescing front of `kafka`."""
    registry: StatSource
    """Leader's in-memory stats."""
    topology: TopicMap
    """Topic-region map."""
    mailbox: FlushMailbox
    """Flush instructions to datanodes."""
    locks: TopicLocks
    """Per-topic read/write locks (registration vs purge)."""
    metrics: Metrics
    """Prometheus series."""
    settings: Settings
    """Configuration."""
    executor: concurrent.futures.Executor
    """Thread pool for blocking kv calls."""
    committer: GroupCommitter
    """Merges concurrent kv transactions (see procedures/_group_commit.py)."""
