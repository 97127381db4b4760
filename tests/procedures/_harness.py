"""A metasrv leader's procedure stack on real services, for tests and the crash runner.

Everything is the real code: `EtcdKv` and `EtcdElection` on etcd, `KafkaAdmin` on the
broker, `TopicRegionMap`, `RegionRegistry`, `Mailbox`, `TopicLocks` and `ProcedureManager`,
and the SQL history on a migrated database. Region stats are put into the registry the
way the heartbeat handler does (`RegionRegistry.update`); that is the only shortcut.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from sqlalchemy import Engine, create_engine

from metasrv.election import Election, EtcdElection, SqlElection
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from metasrv.leader import (
    Leadership,
    Mailbox,
    RegionRegistry,
    TopicLocks,
    TopicRegionMap,
)
from metasrv.metrics import Metrics
from metasrv.model import PartitionOffsets, RegionStat
from metasrv.settings import Settings, load_settings
from metasrv.sql import engine_url
from procedures import Procedure
from procedures.wal_purge import PurgeServices, purge_manager
from tests._stats import report
from tests._wait import eventually


def make_settings(
    *,
    kafka: str,
    etcd: str | list[str],
    prefix: str,
    num_topics: int = 4,
    wal: dict[str, Any] | None = None,
    procedure: dict[str, Any] | None = None,
    lease_secs: int = 2,
    sql_url: str | None = None,
) -> Settings:
    """Settings for one test: its own topic pool and kv key prefix, fast retries; the kv
    on etcd, or on the SQL database at `sql_url` (migrated) when given."""
    kv: dict[str, Any] = {
        "backend": "etcd",
        "etcd_endpoints": [etcd] if isinstance(etcd, str) else etcd,
        "key_prefix": f"{prefix}/",
    }
    if sql_url is not None:
        kv = {"backend": "sql", "sql_url": sql_url, "key_prefix": f"{prefix}/"}
    return load_settings(
        wal={
            "broker_endpoints": [kafka],
            "topic_name_prefix": prefix,
            "num_topics": num_topics,
            "region_stat_ttl": "30s",
            "flush_wait_timeout": "2s",
            "auto_prune_interval": "0s",
            **(wal or {}),
        },
        procedure={"retry_delay": "50ms", "max_retry_times": 12, **(procedure or {})},
        kv=kv,
        election={"lease_secs": lease_secs},
    )


class Harness:
    """One would-be leader: build, `start()`, use, `close()`.

    Its kv and election are etcd's, or the SQL ones (`SqlKv`, `SqlElection`) when the
    settings name a SQL kv. `kv` replaces the kv the procedures use; `wrap` wraps the real
    one (a test's fault injection); the election always uses the real store. `kinds`: the
    procedure kinds its manager runs besides `WalPurge`.
    """

    def __init__(
        self,
        settings: Settings,
        history_url: str,
        *,
        name: str | None = None,
        kv: KvBackend | None = None,
        wrap: Callable[[KvBackend], KvBackend] | None = None,
        kafka: KafkaAdmin | None = None,
        kinds: Sequence[type[Procedure[Any, PurgeServices]]] = (),
    ) -> None:
        self.settings = settings
        self.prefix = settings.wal.topic_name_prefix
        self.bootstrap = settings.wal.broker_endpoints[0]
        self.name = name or f"node-{uuid.uuid4().hex[:6]}"
        lease_secs = settings.election.lease_secs
        self.election: Election
        base_kv: KvBackend
        if settings.kv.backend == "etcd":
            etcd_kv = EtcdKv(settings.kv.etcd_endpoints, settings.kv.key_prefix)
            self.election = EtcdElection(
                etcd_kv, node_name=self.name, addr=self.name, lease_secs=lease_secs
            )
            base_kv = etcd_kv
        else:
            url, key_prefix = settings.kv.sql_url, settings.kv.key_prefix
            base_kv = SqlKv(url, key_prefix)
            self.election = SqlElection(
                url, key_prefix, node_name=self.name, addr=self.name, lease_secs=lease_secs
            )
        self._base_kv = base_kv
        self.kv: KvBackend = kv or (wrap(base_kv) if wrap is not None else base_kv)
        self.kafka = kafka or KafkaAdmin.from_settings(settings.wal)
        self.locks = TopicLocks()
        self.registry = RegionRegistry()
        self.metrics = Metrics()
        self.region_map = TopicRegionMap(
            self.kv, self.kafka, self.locks, settings, fence=self.election.fence
        )
        self.mailbox = Mailbox(self.registry, metrics=self.metrics)
        self.engine: Engine = create_engine(engine_url(history_url))
        self.services = PurgeServices.build(
            kv=self.kv,
            history=self.engine,
            election=self.election,
            kafka=self.kafka,
            registry=self.registry,
            region_map=self.region_map,
            mailbox=self.mailbox,
            locks=self.locks,
            metrics=self.metrics,
            settings=settings,
        )
        self.manager = purge_manager(self.services, *kinds)
        # As the daemon wires it: the map loads before the manager resumes procedures.
        self.leadership = Leadership(self.election)
        self.leadership.add_hook("map", self._load_map, self._drop_view)
        self.leadership.add_hook("procedures", self.manager.lead, self.manager.follow)

    async def _load_map(self) -> bool:
        await self.region_map.load()
        return True

    async def _drop_view(self) -> None:
        self.region_map.unload()
        self.registry.clear()

    async def start(self, *, wait_leader: float = 20.0) -> None:
        """Campaign and wait until the manager leads."""
        await self.manager.start()
        await self.leadership.start()
        await self.election.start()
        await eventually(lambda: self.manager.leading, f"{self.name} leading", timeout=wait_leader)

    async def close(self) -> None:
        await self.manager.stop()
        await self.leadership.close()
        await self.services.events.flush(5.0)
        self.services.close()
        await self.election.stop()
        self._base_kv.close()
        if self.kv is not self._base_kv:
            self.kv.close()
        self.engine.dispose()

    # -- world helpers ------------------------------------------------------------------

    def topic(self, n: int) -> str:
        return f"{self.prefix}_{n}"

    async def register(self, region_id: int, topic: str, node_id: int = 1) -> None:
        await self.region_map.register(region_id, node_id, topic)

    def report(
        self,
        region_id: int,
        topic: str,
        flushed: int,
        *,
        latest: int | None = None,
        node_id: int = 1,
        memtable: int = 100,
        age: float = 0.0,
    ) -> None:
        """What a heartbeat carrying this region's stat does to the registry."""
        stat = RegionStat(
            region_id=region_id,
            node_id=node_id,
            topic=topic,
            flushed_entry_id=flushed,
            topic_latest_entry_id=latest,
            memtable_bytes=memtable,
            manifest_version=1,
            received_at=time.monotonic() - age,
        )
        report(self.registry, [stat])

    def report_topic(self, topic: str, latest: int, *, record_size: int, record_num: int) -> None:
        self.registry.report_topic(1, topic, latest, record_size, record_num, time.monotonic())

    def produce(self, topic: str, count: int, *, size: int = 100) -> None:
        produce(self.bootstrap, topic, count, size=size)

    def offsets(self, topic: str) -> PartitionOffsets:
        return self.kafka.offsets([topic])[topic]

    def marker(self, topic: str) -> int | None:
        from metasrv import keys

        stored = self.kv.get(keys.topic_name(topic))
        return None if stored is None else keys.decode_marker(stored.value).pruned_entry_id

    async def at_step(self, procedure_id: str, step: str) -> bool:
        """Whether the procedure is now at `step` (to wait for with `eventually`)."""
        return (await self.manager.get(procedure_id)).step == step

    def lock_users(self, topic: str) -> int:
        """Tasks holding or waiting for `topic`'s lock: a test holding it shared sees a
        purge queued behind it as 2."""
        lock = self.locks._locks.get(topic)
        return 0 if lock is None else lock.users

    def readable(self, topic: str, offset: int) -> bool:
        return readable(self.bootstrap, topic, offset)


def produce(bootstrap: str, topic: str, count: int, *, size: int = 100) -> None:
    """Append `count` records of `size` bytes to partition 0."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failures: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    payload = b"x" * size
    for _ in range(count):
        producer.produce(topic, value=payload, partition=0, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []


def readable(bootstrap: str, topic: str, offset: int, timeout: float = 20.0) -> bool:
    """Read the record at `offset` as a region replay does (`auto.offset.reset=error`).

    True when the record is returned; False when Kafka says the offset is out of range.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "error",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is None:
                assert msg.offset() == offset
                return True
            if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                return False
            raise AssertionError(f"unexpected consumer error: {err}")
        raise AssertionError(f"no answer reading {topic}@{offset} in {timeout}s")
    finally:
        consumer.close()
