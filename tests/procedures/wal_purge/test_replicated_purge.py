"""The WAL purge on a replicated partition (3 brokers, RF 3, min ISR 2) with a follower
paused: replay-start is never below Kafka's log start, and the purge still completes.

Kafka's partition leader moves its log start as soon as DeleteRecords arrives, then holds
the request until every live replica has caught up or `wal.delete_records_wait` passes.
An idle region's replay-start must never point below the log start meanwhile
(DESIGN §1): it would fail to open under `auto.offset.reset=error`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from metasrv.errors import KafkaUnavailable
from metasrv.kafka import KafkaAdmin
from procedures import ProcedureState
from procedures.wal_purge import submit_purges
from tests.procedures._harness import Harness, make_settings
from toolbox.stack import Cluster

pytestmark = pytest.mark.cluster

RECORDS = 200
IDLE = 1  # flushed 10, idle at the topic's latest entry: needs nothing from the WAL
BUSY = 2  # flushed 149: P = 149


@pytest.fixture
async def replicated(
    cluster_stack: Cluster, unique_prefix: str, history_url: str
) -> AsyncIterator[tuple[Harness, str]]:
    brokers = cluster_stack.kafka_bootstrap.split(",")
    settings = make_settings(
        kafka=cluster_stack.kafka_bootstrap,
        etcd=cluster_stack.etcd_endpoints,
        prefix=unique_prefix,
        wal={"broker_endpoints": brokers, "replication_factor": 3},
        procedure={"retry_delay": "200ms"},
    )
    h = Harness(settings, history_url)
    topic = h.topic(0)
    try:
        await h.start()
        await h.register(IDLE, topic)
        await h.register(BUSY, topic)
        yield h, topic
    finally:
        cluster_stack.heal()
        await h.close()
        admin = KafkaAdmin(cluster_stack.kafka_bootstrap)
        admin.delete_topics([topic])
        admin.close()


async def test_replay_start_never_below_log_start_while_a_follower_is_paused(
    cluster_stack: Cluster, replicated: tuple[Harness, str]
) -> None:
    h, topic = replicated
    h.produce(topic, RECORDS)
    h.report(IDLE, topic, flushed=10, latest=RECORDS - 1, memtable=0)
    h.report(BUSY, topic, flushed=149)
    leader = cluster_stack.partition_leader(topic)
    follower = next(b for b in cluster_stack.brokers if b != cluster_stack.broker_of(leader))
    # The probe's metadata requests may land on the paused broker: a read that times out
    # is a sample lost, not a finding.
    probe = KafkaAdmin(
        cluster_stack.kafka_bootstrap,
        request_timeout=2.0,
        security={"socket.connection.setup.timeout.ms": 1000},
    )
    cluster_stack.pause(follower)
    started = time.monotonic()
    try:
        [pid] = await submit_purges(h.manager, [topic], reason="test")
        lies: list[tuple[float, int, int]] = []
        samples = 0
        while not (await h.manager.get(pid)).state.terminal:
            # Log start first, then the marker: the marker only moves forward, so a
            # replay-start below this log start is a real lie, not a sampling race.
            try:
                read = await asyncio.to_thread(probe.offsets, [topic], topic_ids=False)
            except KafkaUnavailable:
                continue
            log_start = read[topic].log_start_offset
            marker = h.marker(topic)
            replay_start = max(10, marker if marker is not None else -1) + 1
            samples += 1
            if replay_start < log_start:
                lies.append((time.monotonic() - started, replay_start, log_start))
            await asyncio.sleep(0.05)  # the probe's sampling period, not a wait
            assert time.monotonic() - started < 60, "purge did not finish in 60 s"
        view = await h.manager.get(pid)
        took = time.monotonic() - started
    finally:
        cluster_stack.resume(follower)
        probe.close()
    assert view.state is ProcedureState.SUCCEEDED, view
    # The broker waits `wal.delete_records_wait` (2 s) for the paused follower, then the
    # partition leader's log start decides: not the 10 s admin request timeout. Each of the
    # purge's two offsets reads may also wait 2 s for DescribeTopics' topic id when
    # librdkafka takes the paused broker for the controller.
    assert took < 12.0, f"purge took {took:.1f}s with a follower paused"
    assert samples > 5
    assert lies == [], f"replay-start below Kafka's log start: {lies[:5]} ... ({len(lies)})"
    assert h.marker(topic) == 149
    assert h.offsets(topic).log_start_offset == 149
    assert h.readable(topic, 149) and not h.readable(topic, 148)
