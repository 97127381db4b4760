"""A Hypothesis state machine driving the real `WalPurge` through the real procedure
framework (`ProcedureManager`, its store, runner and locks), the real topic-region map,
stat registry and marker code, on an in-memory SQLite kv (the real SQL backend) and an
in-memory Kafka double: pure logic, so doubles are enough here. The invariants are the
protocol model's (tests/procedures/wal_purge/protocol_model): no entry a registered region
has not flushed is deleted by metasrv; replay-start never skips an unflushed entry and the
datanode's start (`replay_from`) is readable unless something else than metasrv deleted
below it; every purge ends (no stuck lock); a deposed leader's marker write never lands.

Each rule runs to completion (a purge runs until its record is terminal), so the
interleavings inside one purge are the exhaustive model's job; this machine checks that
the real objects, wired as the daemon wires them, keep the same invariants over long
histories the model's bounds do not reach.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import create_engine

import migrations
from metasrv import keys
from metasrv.datanode import replay_from
from metasrv.errors import KafkaUnavailable, LeadershipLost, MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.kv import Compare, KvBackend, SqlKv
from metasrv.leader import (
    Mailbox,
    RegionRegistry,
    TopicLocks,
    TopicRegionMap,
    regresses,
    row_of,
)
from metasrv.metrics import Metrics
from metasrv.model import PartitionOffsets, RegionStat, replay_start_entry_id
from metasrv.settings import Settings, load_settings
from metasrv.sql import engine_url
from procedures import ProcedureManager
from procedures.wal_purge import (
    PurgeServices,
    advance_marker,
    plan_topic,
    purge_manager,
    submit_purges,
)
from tests._stats import report

T = TypeVar("T")
PREFIX = "hyp"
TOPIC = f"{PREFIX}_0"
REGIONS = (1, 2)
MAX_HWM = 8
EXAMPLES = 150
OUTCOMES: dict[str, int] = {}
"""How the machine's purges ended, over a test (it must have cut something)."""


@dataclass
class FakeTopic:
    topic_id: str
    log_start: int = 0
    hwm: int = 0


class FakeKafka:
    """The `KafkaAdmin` methods the purge and the map use, over in-memory partitions.
    `on_delete(topic, old_log_start, new_log_start)` is told of every DeleteRecords."""

    def __init__(self) -> None:
        self.topics: dict[str, FakeTopic] = {}
        self.created = 0
        self.on_delete: Callable[[str, int, int], None] = lambda topic, old, new: None

    def create(self, topic: str) -> None:
        self.created += 1
        self.topics[topic] = FakeTopic(f"00000000-0000-0000-0000-{self.created:012d}")

    def list_topics(self) -> set[str]:
        return set(self.topics)

    def ensure_topics(self, topics: Iterable[str], **_: Any) -> list[str]:
        missing = sorted(set(topics) - set(self.topics))
        for topic in missing:
            self.create(topic)
        return missing

    def offsets_each(
        self, topics: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, PartitionOffsets | MetasrvError]:
        out: dict[str, PartitionOffsets | MetasrvError] = {}
        for topic in topics:
            found = self.topics.get(topic)
            out[topic] = (
                KafkaUnavailable(f"unknown topic {topic}")
                if found is None
                else PartitionOffsets(found.log_start, found.hwm, found.topic_id)
            )
        return out

    def topic_id(self, topic: str, *, timeout: float | None = None) -> str:
        found = self.topics.get(topic)
        if found is None:
            raise KafkaUnavailable(f"unknown topic {topic}")
        return found.topic_id

    def offsets(
        self, topics: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, PartitionOffsets]:
        out = {}
        for topic, got in self.offsets_each(topics).items():
            if isinstance(got, MetasrvError):
                raise got
            out[topic] = got
        return out

    def delete_records(self, targets: Mapping[str, int]) -> dict[str, int]:
        out = {}
        for topic, offset in targets.items():
            found = self.topics[topic]
            if offset > found.hwm:
                raise KafkaUnavailable(f"{topic}: offset {offset} above {found.hwm}")
            old = found.log_start
            found.log_start = max(old, offset)
            self.on_delete(topic, old, found.log_start)
            out[topic] = found.log_start
        return out

    def close(self) -> None:
        pass


class TermFence:
    """The election as procedures see it: the kv's election key holds the leading term."""

    def __init__(self, term: int) -> None:
        self.term = term
        self.leading = True

    @property
    def is_leader(self) -> bool:
        return self.leading

    def fence(self) -> list[Compare]:
        return [Compare(keys.ELECTION_KEY, value=str(self.term).encode())]

    def leader_addr(self) -> str | None:
        return "machine"

    def add_listener(self, listener: Any) -> None:
        pass


@dataclass
class Leader:
    fence: TermFence
    services: PurgeServices
    manager: ProcedureManager[PurgeServices]
    region_map: TopicRegionMap
    registry: RegionRegistry


@dataclass
class Region:
    registered: bool = False
    mem: list[tuple[str, int]] = field(default_factory=list)
    """Unflushed entries: (Kafka topic id, offset)."""
    flushed: int = -1


def _settings() -> Settings:
    return load_settings(
        wal={
            "broker_endpoints": ["127.0.0.1:1"],
            "topic_name_prefix": PREFIX,
            "num_topics": 1,
            "region_stat_ttl": "300s",
            "flush_wait_timeout": "1s",
            "flush_trigger_size": "1TB",
            "auto_prune_interval": "0s",
        },
        procedure={"retry_delay": "5ms", "max_retry_times": 2},
        kv={"backend": "sql", "sql_url": "sqlite://"},
    )


class PurgeMachine(RuleBasedStateMachine):
    history_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.settings = _settings()
        self.kv: KvBackend = SqlKv.open("sqlite://", create=True)
        self.kafka = FakeKafka()
        self.kafka.on_delete = self._deleted
        self.engine = create_engine(engine_url(self.history_url))
        self.regions = {r: Region() for r in REGIONS}
        self.violations: list[str] = []
        self.term = 0
        """The topic was recreated before a marker recorded its id (a known gap)."""
        self.purged = 0
        """Where metasrv's own DeleteRecords moved the log start (this incarnation)."""
        self.leader = self.run(self._lead())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _lead(self) -> Leader:
        self.term += 1
        self.kv.put(keys.ELECTION_KEY, str(self.term).encode())
        fence = TermFence(self.term)
        locks, registry, metrics = TopicLocks(), RegionRegistry(), Metrics()
        kafka = cast(KafkaAdmin, self.kafka)
        region_map = TopicRegionMap(self.kv, kafka, locks, self.settings, fence=fence.fence)
        await region_map.load()
        services = PurgeServices.build(
            kv=self.kv,
            history=self.engine,
            election=fence,
            kafka=kafka,
            registry=registry,
            region_map=region_map,
            mailbox=Mailbox(registry, metrics=metrics),
            locks=locks,
            metrics=metrics,
            settings=self.settings,
            kv_threads=2,
            batch_window=0.0,
        )
        manager = purge_manager(services)
        await manager.start()
        assert await manager.lead()
        return Leader(fence, services, manager, region_map, registry)

    async def _depose(self, leader: Leader, *, close: bool = True) -> None:
        leader.fence.leading = False
        await leader.manager.follow()
        await leader.manager.stop()
        await leader.services.events.flush(5.0)
        if close:
            leader.services.close()

    def teardown(self) -> None:
        self.run(self._depose(self.leader))
        self.kv.close()
        self.engine.dispose()
        self.loop.close()

    # -- the world -----------------------------------------------------------------------

    def _deleted(self, topic: str, old: int, new: int) -> None:
        topic_id = self.kafka.topics[topic].topic_id
        if new > old:
            self.purged = max(self.purged, new)
        for region_id, region in self.regions.items():
            gone = [o for t, o in region.mem if t == topic_id and old <= o < new]
            if region.registered and gone:
                self.violations.append(
                    f"DeleteRecords({new}) removed entries {gone} region {region_id} needs"
                )

    def _topic(self) -> FakeTopic:
        if TOPIC not in self.kafka.topics:
            self.kafka.create(TOPIC)
        return self.kafka.topics[TOPIC]

    @initialize(both=st.booleans())
    def first_regions(self, both: bool) -> None:
        """Region 1 is registered (its topic created) before anything else, maybe 2 too."""
        self.register(1)
        if both:
            self.register(2)

    @rule(region_id=st.sampled_from(REGIONS))
    def register(self, region_id: int) -> None:
        region = self.regions[region_id]
        if region.registered:
            return
        self.run(self.leader.region_map.register(region_id, 1, TOPIC))
        region.registered = True

    @precondition(lambda self: TOPIC in self.kafka.topics)
    @rule(region_id=st.sampled_from(REGIONS), count=st.integers(1, 3))
    def write(self, region_id: int, count: int) -> None:
        region, topic = self.regions[region_id], self._topic()
        if not region.registered:
            return
        for _ in range(count):
            if topic.hwm >= MAX_HWM:
                return
            region.mem.append((topic.topic_id, topic.hwm))
            topic.hwm += 1

    @rule(region_id=st.sampled_from(REGIONS))
    def flush(self, region_id: int) -> None:
        region = self.regions[region_id]
        if region.mem:
            region.flushed = region.mem[-1][1]
            region.mem.clear()

    @precondition(lambda self: TOPIC in self.kafka.topics)
    @rule(region_id=st.sampled_from(REGIONS), count=st.integers(1, 3))
    def busy_round(self, region_id: int, count: int) -> None:
        """A datanode's busy round: it writes, flushes and reports the truth."""
        self.write(region_id, count)
        self.flush(region_id)
        self.heartbeat(region_id, 0, False)

    @rule(region_id=st.sampled_from(REGIONS), lag=st.integers(0, 3), idle=st.booleans())
    def heartbeat(self, region_id: int, lag: int, idle: bool) -> None:
        """A report carrying any flushed id between the stored one and the truth."""
        region = self.regions[region_id]
        if not region.registered or TOPIC not in self.kafka.topics:
            return
        registry = self.leader.registry
        stored = registry.get(region_id, TOPIC)
        low = stored.flushed_entry_id if stored is not None else -1
        flushed = max(low, region.flushed - lag)
        claim = self.kafka.topics[TOPIC].hwm - 1 if idle and not region.mem else None
        if stored is not None and regresses(row_of(stored), flushed, 1):
            return
        stat = RegionStat(
            region_id, 1, TOPIC, flushed, claim, 0 if claim is not None else 1, 1, time.monotonic()
        )
        report(registry, [stat])

    @rule()
    def purge(self) -> None:
        manager = self.leader.manager

        async def go() -> None:
            [pid] = await submit_purges(manager, [TOPIC], reason="machine")
            view = await manager.wait(pid, 30)
            assert view.state.terminal, f"purge {pid} did not end: {view}"
            said = (view.outcome or str(view.error or "")).split(":")[0][:40]
            key = f"{view.state.value}: {said}"
            OUTCOMES[key] = OUTCOMES.get(key, 0) + 1

        self.run(go())
        assert self.kv.get(keys.lock(TOPIC)) is None, "the topic's kv lock outlived its purge"

    @rule()
    def leader_change(self) -> None:
        old = self.leader
        self.run(self._depose(old, close=False))
        self.leader = self.run(self._lead())
        # The deposed leader's marker write lands late: the fence refuses it.
        before = self.kv.get(keys.topic_name(TOPIC))
        try:
            self.run(advance_marker(old.services, TOPIC, MAX_HWM))
        except LeadershipLost:
            OUTCOMES["late marker write refused"] = OUTCOMES.get("late marker write refused", 0) + 1
        except MetasrvError:
            pass  # a reset latched: refused before the fence is asked
        old.services.close()
        after = self.kv.get(keys.topic_name(TOPIC))
        if (before is None) != (after is None) or (
            before is not None and after is not None and before.value != after.value
        ):
            self.violations.append("a deposed leader's marker write landed")

    @precondition(lambda self: TOPIC in self.kafka.topics)
    @rule(data=st.data())
    def retention(self, data: st.DataObject) -> None:
        """Kafka's log start moved by something else (retention, another tool)."""
        topic = self.kafka.topics[TOPIC]
        if topic.log_start < topic.hwm:
            topic.log_start = data.draw(st.integers(topic.log_start + 1, topic.hwm))

    @precondition(lambda self: TOPIC in self.kafka.topics)
    @rule()
    def recreate(self) -> None:
        """The topic deleted and recreated: a new topic id, offsets from 0."""
        self.kafka.create(TOPIC)
        self.purged = 0

    @rule(region_id=st.sampled_from(REGIONS))
    def restart(self, region_id: int) -> None:
        """The region restarts: replay-start as the API answers it, then the datanode's
        consumer from `replay_from`."""
        region = self.regions[region_id]
        route = self.leader.region_map.route(region_id)
        if not region.registered or route is None or TOPIC not in self.kafka.topics:
            return
        stored = self.kv.get(keys.topic_name(TOPIC))
        marker = keys.decode_marker(stored.value) if stored is not None else keys.Marker()
        topic = self.kafka.topics[TOPIC]
        if marker.reset is not None or self._unlatched_reset(marker, topic):
            return  # an error answer (409 topic_reset): the region waits for an operator
        stat = self.leader.registry.get(region_id, TOPIC)
        answer = replay_start_entry_id(stat, route.checkpoint_entry_id, marker.pruned_entry_id)
        needed = [o for t, o in region.mem if t == topic.topic_id]
        own = max(
            stat.prunable_entry_id if stat is not None else -1,
            route.checkpoint_entry_id if route.checkpoint_entry_id is not None else -1,
        )
        if needed and answer > min(needed) and answer > own + 1:
            self.violations.append(f"replay-start {answer} skips entry {min(needed)}")
        start = replay_from(answer, region.flushed)
        lost_outside = any(t != topic.topic_id or o < topic.log_start for t, o in region.mem)
        if start < self.purged and start < topic.log_start and not lost_outside:
            self.violations.append(f"replay from {start} below the log start {topic.log_start}")
        region.mem = [(t, o) for t, o in region.mem if t == topic.topic_id and o >= start]

    def _unlatched_reset(self, marker: keys.Marker, topic: FakeTopic) -> bool:
        """The API's check for a reset no purge latched yet (api/queries.py): the
        planner's rule over no regions."""
        if marker.pruned_entry_id is None and marker.topic_id is None:
            return False
        plan = plan_topic(
            TOPIC,
            {},
            self.leader.registry.topic_snapshot(TOPIC),
            now=time.monotonic(),
            stat_ttl=300.0,
            pruned_entry_id=marker.pruned_entry_id,
            offsets=PartitionOffsets(topic.log_start, topic.hwm, topic.topic_id),
            marker=marker,
            compare_reports=False,
        )
        return plan.topic_reset is not None

    @invariant()
    def nothing_needed_was_deleted(self) -> None:
        assert not self.violations, self.violations


def _run(tmp_path: Path, examples: int, *, shrink: bool = True, fixed: bool = False) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    migrations.upgrade(url)
    PurgeMachine.history_url = url
    OUTCOMES.clear()
    run_state_machine_as_test(
        PurgeMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            phases=list(Phase) if shrink else [Phase.explicit, Phase.generate],
            derandomize=fixed,
        ),
    )


def test_the_real_purge_keeps_the_protocol_invariants(tmp_path: Path) -> None:
    # Derandomised: the same histories every run, so the coverage floor below is stable.
    _run(tmp_path, EXAMPLES, fixed=True)
    print("purge outcomes:", OUTCOMES)
    assert sum(n for k, n in OUTCOMES.items() if k.startswith("succeeded")) >= 5, OUTCOMES
    assert OUTCOMES.get("late marker write refused", 0) > 0, OUTCOMES


def test_the_machine_catches_a_map_that_forgets_a_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plans made from a map missing the highest mapped region (a stale map) are caught."""
    real = TopicRegionMap.routes_by_topic

    def forgetful(self: TopicRegionMap) -> dict[str, dict[int, Any]]:
        out = {}
        for topic, routes in real(self).items():
            kept = dict(routes)
            if len(kept) > 1:
                kept.pop(max(kept))
            out[topic] = kept
        return out

    monkeypatch.setattr(TopicRegionMap, "routes_by_topic", forgetful)
    with pytest.raises(AssertionError, match="needs"):
        _run(tmp_path, 2 * EXAMPLES, shrink=False, fixed=True)
