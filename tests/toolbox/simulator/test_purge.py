"""Purges driven by simulated datanodes on a real `metasrv start` child (etcd kv, Kafka):
safety and liveness as a datanode sees them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metasrv import wire
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.wire import MetasrvClient
from tests.toolbox.simulator._heartbeats import reported
from tests.toolbox.simulator._metasrv import DATANODE, OPERATOR, settings, start_metasrv
from toolbox.simulator import SimDatanode, SimRegion, free_port

A, B, C = (11 << 32) | 1, (11 << 32) | 2, (11 << 32) | 3


@dataclass(frozen=True)
class Served:
    url: str
    topic: str


@pytest.fixture
def served(
    kafka_bootstrap: str, etcd_endpoint: str, unique_prefix: str, tmp_path: Path
) -> Iterator[Served]:
    """A metasrv leader on etcd with the ticker off, one topic and a 4 KiB flush trigger."""
    kv = {"backend": "etcd", "etcd_endpoints": [etcd_endpoint], "key_prefix": f"/{unique_prefix}/"}
    sections = settings(
        unique_prefix,
        kafka_bootstrap,
        free_port(),
        kv,
        f"sqlite:///{tmp_path / 'history.db'}",
        num_topics=1,
        flush_trigger_size="4KB",
        flush_wait_timeout="10s",
    )
    proc = start_metasrv(tmp_path, "metasrv", sections)
    try:
        proc.start()
        yield Served(proc.url, f"{unique_prefix}_0")
    finally:
        proc.stop()
        etcd = EtcdKv(etcd_endpoint, f"/{unique_prefix}/")
        etcd.delete_prefix("")
        etcd.close()
        admin = KafkaAdmin(kafka_bootstrap)
        admin.delete_topics(t for t in admin.list_topics() if t.startswith(unique_prefix))
        admin.close()


@pytest.fixture
def operator(served: Served) -> Iterator[MetasrvClient]:
    with MetasrvClient(served.url, token=OPERATOR) as client:
        yield client


@pytest.fixture
def datanode(served: Served, kafka_bootstrap: str, tmp_path: Path) -> Iterator[SimDatanode]:
    """A datanode heartbeating every 0.3 s whose regions flush only when told."""
    node = SimDatanode(
        1,
        served.url,
        DATANODE,
        kafka_bootstrap,
        tmp_path / "dn",
        heartbeat_interval=0.3,
        flush_threshold_bytes=None,
    )
    yield node
    node.close()


def write(region: SimRegion, n: int) -> list[int]:
    return [f.result(30) for f in [region.write("x" * 200) for _ in range(n)]]


def purge(operator: MetasrvClient, datanode: SimDatanode, topic: str) -> wire.Procedure:
    reported(datanode)
    (info,) = operator.wait(operator.purge([topic]), timeout=60, poll_interval=0.2)
    assert info.state in ("succeeded", "skipped"), (info.error, info.outcome)
    return info


def crash_and_verify(datanode: SimDatanode) -> dict[int, int]:
    """Kill, restart from the metasrv's replay-start, return missing rows per region."""
    datanode.kill()
    datanode.restart()
    return {v.region_id: v.missing for v in datanode.verify()}


def test_purges_never_cost_a_restarting_region_a_row(
    served: Served, operator: MetasrvClient, datanode: SimDatanode, kafka_admin: KafkaAdmin
) -> None:
    for region in (A, B, C):
        operator.add_region(region, 1, served.topic)
    slow = datanode.add_region(A, served.topic)
    busy = datanode.add_region(B, served.topic)
    datanode.add_region(C, served.topic)  # idle
    datanode.start()
    # The slow region holds entries 0 and 1, never flushed, too little to be asked to flush.
    assert write(slow, 2) == [0, 1]
    write(busy, 8)
    busy.flush()

    purge(operator, datanode, served.topic)  # P = min(-1, 9, 9): nothing the slow region has may go
    assert crash_and_verify(datanode) == {A: 0, B: 0, C: 0}

    slow, busy = datanode.regions[A], datanode.regions[B]
    write(slow, 30)  # now well above the trigger: the purge asks it to flush
    write(busy, 10)
    busy.flush()
    info = purge(operator, datanode, served.topic)
    assert info.state == "succeeded", (info.error, info.outcome)
    assert kafka_admin.offsets([served.topic])[served.topic].log_start_offset > 0
    write(slow, 7)
    assert crash_and_verify(datanode) == {A: 0, B: 0, C: 0}


def test_a_slow_region_is_asked_to_flush_once_its_replay_grows(
    served: Served, operator: MetasrvClient, datanode: SimDatanode
) -> None:
    for region in (A, B):
        operator.add_region(region, 1, served.topic)
    slow = datanode.add_region(A, served.topic)
    busy = datanode.add_region(B, served.topic)
    datanode.start()
    write(slow, 3)  # ~700 bytes to replay: below the 4 KiB trigger
    write(busy, 5)
    busy.flush()
    purge(operator, datanode, served.topic)
    assert datanode.flushes_instructed == 0

    write(slow, 60)  # ~16 KiB to replay
    info = purge(operator, datanode, served.topic)
    assert datanode.flushes_instructed >= 1
    assert slow.flushed_entry_id >= 0
    assert info.state == "succeeded", info
    (plan,) = operator.plan(served.topic)
    assert plan.pruned_entry_id is not None and plan.pruned_entry_id >= 3


@pytest.mark.parametrize(
    "advance",
    [
        pytest.param(True, id="advancing"),
        pytest.param(False, id="design-literal"),
    ],
)
def test_an_idle_region_that_writes_again_is_not_reported_as_data_loss(
    served: Served, operator: MetasrvClient, datanode: SimDatanode, advance: bool
) -> None:
    datanode.advance_flushed_when_idle = advance
    for region in (A, B):
        operator.add_region(region, 1, served.topic)
    quiet = datanode.add_region(A, served.topic)
    busy = datanode.add_region(B, served.topic)
    datanode.start()
    write(quiet, 3)
    quiet.flush()  # flushed 2, then idle: reports the topic's latest entry id
    write(busy, 10)
    busy.flush()
    info = purge(operator, datanode, served.topic)
    assert info.state == "succeeded", (info.error, info.outcome)
    (plan,) = operator.plan(served.topic)
    assert plan.pruned_entry_id == 12  # min(A: topic latest 12, B: flushed 12)

    write(quiet, 5)  # A needs 13..17 now; nothing it needs is gone
    write(busy, 5)
    busy.flush()
    reported(datanode)
    (plan,) = operator.plan(served.topic)
    assert plan.data_loss == []
    info = purge(operator, datanode, served.topic)
    assert info.state in ("succeeded", "skipped"), (info.error, info.outcome)
    assert crash_and_verify(datanode) == {A: 0, B: 0}


def test_regions_opened_or_restarted_behind_the_marker_write_without_a_data_loss_alarm(
    served: Served, operator: MetasrvClient, datanode: SimDatanode
) -> None:
    for region in (A, B):
        operator.add_region(region, 1, served.topic)
    quiet = datanode.add_region(A, served.topic)
    busy = datanode.add_region(B, served.topic)
    datanode.start()
    write(quiet, 3)
    quiet.flush()  # A: flushed 2, then idle
    write(busy, 10)
    busy.flush()
    assert purge(operator, datanode, served.topic).state == "succeeded"
    (plan,) = operator.plan(served.topic)
    assert plan.pruned_entry_id == 12 > quiet.flushed_entry_id + 1

    datanode.kill()
    datanode.restart()
    write(datanode.regions[A], 4)  # at once, before any heartbeat of the new incarnation
    operator.add_region(C, 1, served.topic)
    write(datanode.add_region(C, served.topic), 4)  # a new region on a purged topic
    write(datanode.regions[B], 4)
    datanode.regions[B].flush()
    reported(datanode)
    (plan,) = operator.plan(served.topic)
    assert plan.data_loss == []
    assert plan.blocked_by == []
    assert purge(operator, datanode, served.topic).state in ("succeeded", "skipped")
    assert crash_and_verify(datanode) == {A: 0, B: 0, C: 0}
