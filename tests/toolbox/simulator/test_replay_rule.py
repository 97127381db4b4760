"""The replay rule under a lagging stat (issue #34 item 4), on a real `metasrv start` child
and real Kafka: a region flushes, crashes before its report of that flush reaches the
leader, and asks replay-start, which the leader answers from the stat it holds (here none:
0). Its next report then lets a purge delete below its flushed id before its consumer
reads. Started at metasrv's answer, the consumer (`auto.offset.reset=error`) would meet
Kafka's log start above it; the datanode starts at `max(answer, own flushed + 1)` instead,
which reads nothing the region needs from below the log start, and loses no row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metasrv.datanode import (
    AsyncDatanodeClient,
    DatanodeClient,
    Heartbeat,
    RegionReport,
    replay_from,
)
from metasrv.kafka import KafkaAdmin
from metasrv.wire import MetasrvClient
from tests.toolbox.simulator._metasrv import DATANODE, OPERATOR
from toolbox.simulator import MetasrvProcess, SimDatanode

A = (11 << 32) | 1


@pytest.fixture
def operator(metasrv: MetasrvProcess) -> Iterator[MetasrvClient]:
    with MetasrvClient(metasrv.url, token=OPERATOR) as client:
        yield client


def test_a_replay_start_answered_from_a_lagging_stat_loses_no_row(
    metasrv: MetasrvProcess, operator: MetasrvClient, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = operator.add_region(A, 1).topic
    datanode = SimDatanode(
        1, metasrv.url, DATANODE, kafka_bootstrap, tmp_path / "dn", flush_threshold_bytes=None
    )
    admin = KafkaAdmin(kafka_bootstrap)
    try:
        region = datanode.add_region(A, topic)
        first = [region.write(f"a{i}").result(30) for i in range(2)]
        flushed = region.flush()
        assert flushed == first[-1] == 1
        later = [region.write(f"b{i}").result(30) for i in range(2)]
        assert later == [2, 3]
        datanode.kill()  # before any heartbeat: the leader holds no stat of A
        answered: list[int] = []

        def lagging_answer_then_purge(region_id: int) -> int:
            """metasrv's answer, then what happens before the consumer reads: the region's
            report of its flush arrives and a purge deletes below it."""
            start = operator.replay_start(region_id)
            answered.append(start)
            report = RegionReport(region_id, topic, flushed, memtable_bytes=0)
            with DatanodeClient(metasrv.url, token=DATANODE) as client:
                assert client.heartbeat(Heartbeat(node_id=1, regions=[report])).rejected == []
            (done,) = operator.wait(operator.purge([topic]), timeout=60, poll_interval=0.2)
            assert done.state == "succeeded", done
            assert admin.offsets([topic])[topic].log_start_offset == flushed
            return start

        (report,) = datanode.restart(lagging_answer_then_purge, start=False)
        assert answered == [0]  # from the lagging stat: below the region's flushed id + 1
        assert report.start_entry_id == replay_from(0, flushed) == flushed + 1
        assert report.replayed == len(later)
        (verified,) = datanode.verify()
        assert (verified.acknowledged, verified.missing) == (4, 0)
    finally:
        admin.close()
        datanode.close()


def test_a_reopened_region_is_not_idle_before_it_replays(
    metasrv: MetasrvProcess, operator: MetasrvClient, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Its unflushed entries are in Kafka, not in its (empty) memtable: a heartbeat sent
    while it replays must not report the topic's latest id for it, which would let a purge
    delete them."""
    topic = operator.add_region(A, 1).topic
    datanode = SimDatanode(
        1, metasrv.url, DATANODE, kafka_bootstrap, tmp_path / "dn", flush_threshold_bytes=None
    )
    try:
        region = datanode.add_region(A, topic)
        region.write("a").result(30)
        flushed = region.flush()
        region.write("b").result(30)
        datanode.kill()
        reported: list[dict[str, object]] = []

        def report_while_replaying(region_id: int) -> int:
            (entry,) = datanode.heartbeat_payload()["regions"]
            reported.append(entry)
            return operator.replay_start(region_id)

        (replayed,) = datanode.restart(report_while_replaying, start=False)
        assert reported[0]["flushed_entry_id"] == flushed
        assert reported[0]["topic_latest_entry_id"] is None
        assert replayed.replayed == 1
        (after,) = datanode.heartbeat_payload()["regions"]
        assert after["topic_latest_entry_id"] is None  # it holds an unflushed row now
    finally:
        datanode.close()


async def test_the_datanode_clients_answer_never_below_the_regions_own_flushed_id(
    metasrv: MetasrvProcess, operator: MetasrvClient
) -> None:
    operator.add_region(A, 1)  # never reported: metasrv answers 0
    with DatanodeClient(metasrv.url, token=DATANODE) as client:
        assert client.replay_start(A) == 0
        assert client.replay_start(A, flushed_entry_id=4) == 5
        assert client.replay_start(A, flushed_entry_id=-1) == 0
    async with AsyncDatanodeClient(metasrv.url, token=DATANODE) as aclient:
        assert await aclient.replay_start(A, flushed_entry_id=4) == 5


def test_the_rule_never_reads_below_the_answer_nor_the_regions_flushed_id() -> None:
    assert replay_from(0, 1) == 2  # a lagging answer
    assert replay_from(7, 1) == 7  # the marker is ahead (an idle region's topic was purged)
    assert replay_from(5, 4) == 5
    assert replay_from(0, -1) == 0  # nothing flushed
    assert replay_from(3, None) == 3  # the region's flushed id not given: the answer
