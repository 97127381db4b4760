"""The simulator against a real `metasrv start` child: heartbeats, rejections, replay-start, 421."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metasrv.datanode import DatanodeClient
from metasrv.wire import MetasrvClient
from tests.toolbox.simulator._metasrv import DATANODE, OPERATOR, VIEWER, settings, start_metasrv
from toolbox.simulator import MetasrvProcess, SimDatanode, free_port

A, B, C = (9 << 32) | 1, (9 << 32) | 2, (9 << 32) | 3


@pytest.fixture
def operator(metasrv: MetasrvProcess) -> Iterator[MetasrvClient]:
    with MetasrvClient(metasrv.url, token=OPERATOR) as client:
        yield client


def make_datanode(url: str, kafka: str, data_dir: Path) -> SimDatanode:
    """A datanode whose regions flush only when told; heartbeats sent by the test."""
    return SimDatanode(1, url, DATANODE, kafka, data_dir, flush_threshold_bytes=None)


def test_plan_follows_heartbeats_and_restart_replays_from_metasrv(
    metasrv: MetasrvProcess, operator: MetasrvClient, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = operator.add_region(A, 1).topic
    assert operator.add_region(B, 1, topic=topic).topic == topic
    datanode = make_datanode(metasrv.url, kafka_bootstrap, tmp_path / "dn")
    try:
        busy = datanode.add_region(A, topic)
        datanode.add_region(B, topic)  # idle: must not pin the topic
        flushed = max(f.result(30) for f in [busy.write(f"r{i}") for i in range(30)])
        assert busy.flush() == flushed
        for future in [busy.write(f"s{i}") for i in range(10)]:
            future.result(30)

        outcome = datanode.heartbeat_once()
        assert outcome.rejected == ()
        (plan,) = operator.plan(topic)
        assert plan.blocked_by == []
        assert plan.region_count == 2
        assert plan.prune_point == flushed  # min(A flushed, B topic latest = HW - 1)
        assert plan.high_watermark == flushed + 11
        assert operator.replay_start(A) == flushed + 1

        datanode.kill()
        reports = {r.region_id: r for r in datanode.restart(start=False)}
        assert reports[A].start_entry_id == flushed + 1
        assert reports[A].replayed == 10
        verified = {v.region_id: v for v in datanode.verify()}
        assert (verified[A].acknowledged, verified[A].missing) == (40, 0)
    finally:
        datanode.close()


def test_rejected_regions_are_logged_and_the_rest_accepted(
    metasrv: MetasrvProcess,
    operator: MetasrvClient,
    kafka_bootstrap: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = operator.add_region(A, 1).topic
    other = operator.add_region(B, 1).topic
    assert other != topic  # least-loaded first: the second region goes to the other topic
    datanode = make_datanode(metasrv.url, kafka_bootstrap, tmp_path / "dn")
    try:
        datanode.add_region(A, topic)
        datanode.add_region(B, topic)  # mapped to `other`: reported on the wrong topic
        datanode.add_region(C, topic)  # never registered
        outcome = datanode.heartbeat_once()
    finally:
        datanode.close()
    reasons = {r.region_id: r.reason for r in outcome.rejected}
    assert reasons == {B: "topic_mismatch", C: "unknown_region"}
    assert datanode.rejections == list(outcome.rejected)
    assert f"metasrv rejected region {C}: unknown_region" in caplog.text
    (plan,) = operator.plan(topic)
    assert plan.blocked_by == []  # A's stat was stored


def test_heartbeat_sent_to_a_follower_follows_the_421_to_the_leader(
    kafka_bootstrap: str, etcd_endpoint: str, unique_prefix: str, tmp_path: Path
) -> None:
    kv = {"backend": "etcd", "etcd_endpoints": [etcd_endpoint], "key_prefix": f"/{unique_prefix}/"}
    history = f"sqlite:///{tmp_path / 'h.db'}"
    leader = start_metasrv(
        tmp_path, "leader", settings(unique_prefix, kafka_bootstrap, free_port(), kv, history)
    )
    follower = start_metasrv(
        tmp_path, "follower", settings(unique_prefix, kafka_bootstrap, free_port(), kv, history)
    )
    datanode: SimDatanode | None = None
    try:
        leader.start()
        follower.start(expect_leader=False)
        with MetasrvClient(leader.url, token=OPERATOR) as client:
            topic = client.add_region(A, 1).topic
        datanode = make_datanode(follower.url, kafka_bootstrap, tmp_path / "dn")
        datanode.add_region(A, topic)
        outcome = datanode.heartbeat_once()
        assert outcome.rejected == ()
        assert isinstance(datanode.client, DatanodeClient)
        assert datanode.client.current == leader.url
        with MetasrvClient(leader.url, token=VIEWER) as viewer:
            (plan,) = viewer.plan(topic)
        assert plan.blocked_by == []
    finally:
        if datanode is not None:
            datanode.close()
        follower.stop()
        leader.stop()
